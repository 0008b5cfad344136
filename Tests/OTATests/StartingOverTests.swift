import OTA
import Testing

/// A protocol that cannot resume (ESP32's BLE OTA: one START per boot) turns every "run again to
/// resume" into "reset the device, then run again", whichever line of the session said it.
@Suite("Advice for a protocol that cannot resume")
struct StartingOverTests {
    @Test func theResumeAdviceBecomesAResetAndTheErrorIsNoLongerResumable() {
        let stall = OTAError(.timeout, "confirmed no new data", hint: "check the link and the device, then \(OTAError.resumeAdvice)", resumable: true)
        let over = stall.startingOver(protocolName: "esp-ota")
        #expect(over.code == .timeout && over.message == stall.message && !over.resumable)
        #expect(over.hint == "check the link and the device, then reset the device (power cycle, or its reset button), then run the same command again: the esp-ota protocol cannot resume")
        #expect(!over.description.contains("to resume"))
    }

    @Test func aResumableErrorWithOtherAdviceGetsTheResetAfterIt() {
        let over = OTAError(.timeout, "no answer", resumable: true).startingOver(protocolName: "esp-ota")
        #expect(over.hint == "reset the device (power cycle, or its reset button), then run the same command again: the esp-ota protocol cannot resume")
        let hinted = OTAError(.connection, "lost", hint: "move it closer", resumable: true).startingOver(protocolName: "esp-ota")
        #expect(hinted.hint?.hasPrefix("move it closer; reset the device") == true)
    }

    @Test func anErrorThatNeverResumedIsLeftAsItIs() {
        let refused = OTAError(.verifyFailed, "refused", hint: "rebuild the image")
        #expect(refused.startingOver(protocolName: "esp-ota") == refused)
    }
}
