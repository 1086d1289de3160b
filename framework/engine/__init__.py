"""The engine: the step loop (`loop`) and the state it owns. It depends on the plugin
contract (`framework.api.policy`) and on nothing that runs a model: an executor is handed to
it through the `Executor` protocol (`executor`)."""
