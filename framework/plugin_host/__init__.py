"""The plugin host: what loads and guards the policies the contract (`framework.api`)
describes. The registry finds plugins through their entry points and builds their policies
(`registry`), a plugin written for an older API is loaded or told the one line to change
(`compat`), and a policy or an observer that raises is named by its plugin (`guard`,
`faults`). A plugin imports none of it."""
