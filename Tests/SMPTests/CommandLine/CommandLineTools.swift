// The command-line tests' tools, shared with Tests/CLITests.
@_exported import CLITestSupport
