"""The built-in routers: each its own module and entry point, written as a third party would."""
