// The command-line tests' tools (running otaflash in-process, samples, docs/EVENTS.md's tables),
// shared with each protocol's command-line tests beside its module.
@_exported import CLITestSupport
