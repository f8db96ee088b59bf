public import NIOCore
public import NIOSSL
public import X509

/// The server side of TLS: `--tls-cert` and `--tls-key` (PEM), and
/// `--tls-client-ca` for mutual TLS, where every client must present a
/// certificate signed by that CA, and one of its names (`clientPrincipal`:
/// the subject's common name by default) names the connection's principal (a
/// bearer token, if also given, must name the same).
public struct ServerTLS: Sendable {
    public var certificateChainFile: String
    public var privateKeyFile: String
    public var clientCAFile: String?
    public var clientPrincipal: ClientCertificate.PrincipalSource = .commonName

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
    /// Which name of a verified client certificate is the principal.
    public enum PrincipalSource: String, Sendable, CaseIterable {
        /// The subject's (last) common name.
        case commonName = "cn"
        /// The first URI subject alternative name, whole.
        case uri
        /// A SPIFFE ID as Istio and Linkerd issue them,
        /// spiffe://TRUST-DOMAIN/ns/NAMESPACE/sa/ACCOUNT: "NAMESPACE/ACCOUNT".
        case spiffe
        /// The first DNS subject alternative name.
        case dns
    }

    /// The principal a verified client certificate names, read with
    /// swift-certificates. On the channel's event loop, after the handshake.
    public static func principal(of channel: any Channel, from source: PrincipalSource) -> String? {
        guard let certificate = try? channel.pipeline.syncOperations.nioSSL_peerCertificate(),
              let der = try? certificate.toDERBytes() else { return nil }
        return principal(certificate: der, from: source)
    }

    static func principal(certificate der: [UInt8], from source: PrincipalSource) -> String? {
        guard let certificate = try? Certificate(derEncoded: der) else { return nil }
        return principal(of: certificate, from: source)
    }

    /// The principal a verified client certificate names (another transport's TLS).
    public static func principal(of certificate: Certificate, from source: PrincipalSource) -> String? {
        switch source {
        case .commonName:
            var last: String?
            for name in certificate.subject {
                for attribute in name where attribute.type == .RDNAttributeType.commonName { last = String(attribute.value) }
            }
            return last
        case .uri, .spiffe, .dns:
            guard let names = try? certificate.extensions.subjectAlternativeNames else { return nil }
            for name in names {
                switch (source, name) {
                case let (.dns, .dnsName(dns)): return dns
                case let (.uri, .uniformResourceIdentifier(uri)): return uri
                case let (.spiffe, .uniformResourceIdentifier(uri)): if let account = spiffeServiceAccount(uri) { return account }
                default: continue
                }
            }
            return nil
        }
    }

    /// "NAMESPACE/ACCOUNT" of spiffe://TRUST-DOMAIN/ns/NAMESPACE/sa/ACCOUNT; nil for any other URI.
    static func spiffeServiceAccount(_ uri: String) -> String? {
        guard uri.hasPrefix("spiffe://") else { return nil }
        let parts = uri.dropFirst("spiffe://".count).split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 5, !parts[0].isEmpty, parts[1] == "ns", !parts[2].isEmpty, parts[3] == "sa", !parts[4].isEmpty else {
            return nil
        }
        return "\(parts[2])/\(parts[4])"
    }
}
