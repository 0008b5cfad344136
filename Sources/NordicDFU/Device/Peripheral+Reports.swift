import OTADevice

extension NordicDFUPeripheral {
    /// What a control point write did, for people watching the device: a transfer begins when
    /// an init packet is executed as valid; the image is verified and activated when the last
    /// EXECUTE's hash check passed. `before` is the bootloader as the write found it.
    func controlReports(before: NordicDFUBootloader) -> [PeripheralReport] {
        var reports: [PeripheralReport] = []
        if let valid = bootloader.validInit, valid.bytes != before.validInit?.bytes {
            reports.append(.begin(size: Int(valid.command.totalSize), crc: nil, offset: bootloader.executedOffset))
        }
        if bootloader.activations.count > before.activations.count, let activation = bootloader.activations.last {
            reports.append(.verified(crc: nil))
            reports.append(.activated(image: activation.image, version: activation.version.map { "\($0)" }))
        }
        return reports
    }

    /// The data object's progress after a packet write.
    var packetReports: [PeripheralReport] {
        guard bootloader.currentType == .data, let valid = bootloader.validInit else { return [] }
        return [.progress(received: bootloader.writeOffset, total: Int(valid.command.totalSize))]
    }
}
