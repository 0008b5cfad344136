// Test tools shared by the test targets (sample files, deterministic bytes), and the command-line
// tests' (otaflash run in-process), shared with Tests/CLITests.
@_exported import TestSupport
@_exported import CLITestSupport
