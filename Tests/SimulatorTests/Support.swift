// Test tools shared by the test targets (sample files, deterministic bytes).
@_exported import TestSupport
