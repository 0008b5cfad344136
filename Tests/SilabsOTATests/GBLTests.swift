import Testing
@testable import SilabsOTA
