import GATT
import SMP
import Testing

@Suite struct SMPServiceTests {
    @Test func theUUIDsAreMCUmgrs() {
        #expect(SMPService.serviceUUID.description.lowercased() == "8d53dc1d-1db7-4cd3-868b-8a527460aa84")
        #expect(SMPService.characteristicUUID.description.lowercased() == "da2e7828-fbce-4e01-ae9e-261174997c48")
        #expect(SMPService.serviceUUID != SMPService.characteristicUUID)
    }
}
