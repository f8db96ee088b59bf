public import NIOCore
public import NIOSSL

/// The server side of TLS: `--tls-cert` and `--tls-key` (PEM), and
/// `--tls-client-ca` for mutual TLS, where every client must present a
/// certificate signed by that CA and its subject's common name names the
/// connection's principal (a bearer token, if also given, must name the same).
public struct ServerTLS: Sendable {
    public var certificateChainFile: String
    public var privateKeyFile: String
    public var clientCAFile: String?

    public init(certificateChainFile: String, privateKeyFile: String, clientCAFile: String? = nil) {
        self.certificateChainFile = certificateChainFile
        self.privateKeyFile = privateKeyFile
        self.clientCAFile = clientCAFile
    }

    /// Loads the files; any problem stops startup with a message naming the file.
    public func makeContext() throws -> NIOSSLContext {
        let chain: [NIOSSLCertificate]
        do { chain = try NIOSSLCertificate.fromPEMFile(certificateChainFile) } catch {
            throw TLSSetupError(description: "--tls-cert \(certificateChainFile): not a readable PEM certificate chain (\(error))")
        }
        guard !chain.isEmpty else { throw TLSSetupError(description: "--tls-cert \(certificateChainFile) holds no certificate") }
        let key: NIOSSLPrivateKey
        do { key = try NIOSSLPrivateKey(file: privateKeyFile, format: .pem) } catch {
            throw TLSSetupError(description: "--tls-key \(privateKeyFile): not a readable PEM private key (\(error))")
        }
        var configuration = TLSConfiguration.makeServerConfiguration(
            certificateChain: chain.map { .certificate($0) }, privateKey: .privateKey(key))
        configuration.minimumTLSVersion = .tlsv12
        if let clientCAFile {
            let roots: [NIOSSLCertificate]
            do { roots = try NIOSSLCertificate.fromPEMFile(clientCAFile) } catch {
                throw TLSSetupError(description: "--tls-client-ca \(clientCAFile): not a readable PEM certificate (\(error))")
            }
            // A client without a certificate from this CA fails the handshake.
            configuration.certificateVerification = .noHostnameVerification
            configuration.trustRoots = .certificates(roots)
        }
        do { return try NIOSSLContext(configuration: configuration) } catch {
            throw TLSSetupError(description: "TLS: the certificate and key cannot be used together (\(error))")
        }
    }
}

public struct TLSSetupError: Error, CustomStringConvertible {
    public let description: String
}

public enum ClientCertificate {
    /// The name a verified client certificate gives: its subject's (last)
    /// common name (the server takes it as the principal). On the channel's
    /// event loop, after the handshake.
    public static func commonName(of channel: any Channel) -> String? {
        guard let certificate = try? channel.pipeline.syncOperations.nioSSL_peerCertificate(),
              let der = try? certificate.toDERBytes() else { return nil }
        return DERSubject.commonName(certificate: der)
    }
}

/// Just enough DER to read a certificate's subject common name (NIOSSL keeps
/// its own reader internal): Certificate → TBSCertificate → subject Name.
enum DERSubject {
    private static let commonNameOID: [UInt8] = [0x55, 0x04, 0x03]  // 2.5.4.3

    static func commonName(certificate der: [UInt8]) -> String? {
        var outer = Reader(bytes: der[...])
        guard let certificate = outer.element(tag: 0x30) else { return nil }     // Certificate
        var inCertificate = Reader(bytes: certificate.contents)
        guard let tbsCertificate = inCertificate.element(tag: 0x30) else { return nil }
        var tbs = Reader(bytes: tbsCertificate.contents)
        if tbs.peekTag == 0xA0 { _ = tbs.element() }                   // [0] version
        for _ in 0..<4 { guard tbs.element() != nil else { return nil } } // serial, signature, issuer, validity
        guard let subject = tbs.element(tag: 0x30) else { return nil }
        var names = Reader(bytes: subject.contents)
        var found: String?
        while let set = names.element(tag: 0x31) {                      // RelativeDistinguishedName
            var attributes = Reader(bytes: set.contents)
            while let attribute = attributes.element(tag: 0x30) {
                var fields = Reader(bytes: attribute.contents)
                guard let oid = fields.element(tag: 0x06), let value = fields.element() else { continue }
                // UTF8String, PrintableString, IA5String or T61String.
                if Array(oid.contents) == commonNameOID, [0x0C, 0x13, 0x16, 0x14].contains(value.tag) {
                    found = String(validating: value.contents, as: UTF8.self)
                }
            }
        }
        return found.flatMap { $0.isEmpty ? nil : $0 }
    }

    struct Reader {
        var bytes: ArraySlice<UInt8>

        var peekTag: UInt8? { bytes.first }

        mutating func element(tag expected: UInt8? = nil) -> (tag: UInt8, contents: ArraySlice<UInt8>)? {
            guard let tag = bytes.first, expected == nil || tag == expected else { return nil }
            var index = bytes.startIndex + 1
            guard index < bytes.endIndex else { return nil }
            var length = Int(bytes[index])
            index += 1
            if length & 0x80 != 0 {
                let count = length & 0x7F
                guard (1...4).contains(count), index + count <= bytes.endIndex else { return nil }
                length = 0
                for byte in bytes[index..<(index + count)] { length = length << 8 | Int(byte) }
                index += count
            }
            guard length >= 0, index + length <= bytes.endIndex else { return nil }
            let contents = bytes[index..<(index + length)]
            bytes = bytes[(index + length)...]
            return (tag, contents)
        }
    }
}
