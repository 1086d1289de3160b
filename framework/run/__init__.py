"""From a composed config to a finished run: config schemas and checks, the command-line
preflight, loading and serving (`app`), observers, the summary and the files written."""
