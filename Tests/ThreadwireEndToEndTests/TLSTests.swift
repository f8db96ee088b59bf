import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireNIO
@testable import ThreadwireTransport
@testable import ThreadwireServer
import ThreadwireWire


/// Certificates made by integration/make_test_certs.sh (openssl) in a fresh directory.
func makeCertificates() async throws -> String {
    try await offThread { try makeCertificatesBlocking() }
}

private func makeCertificatesBlocking() throws -> String {
    let dir = NSTemporaryDirectory() + "threadwire-certs-" + UUID().uuidString
    let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("integration/make_test_certs.sh").path
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/bin/bash")
    process.arguments = [script, dir]
    try process.run()
    process.waitForExit()
    guard process.terminationStatus == 0 else { throw TestTimeout(description: "make_test_certs.sh failed") }
    return dir
}

/// True when a TLS client cannot get an initialize answered (handshake refused).
private func refused(_ server: ServerProcess, _ tls: ClientTLS) async -> Bool {
    do {
        let client = try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port, tls: tls)
        let response = try await client.call(initializeParams(token: nil))
        return response.code != 0
    } catch {
        return true
    }
}

@Suite("TLS and mutual TLS (real server)", .timeLimit(.minutes(3)))
struct TLSTests {
    @Test("over TLS the Swift client and the CLI work end to end; plain TCP and a client trusting another CA get nothing")
    func tlsEndToEnd() async throws {
        let certs = try await makeCertificates()
        let server = try await ServerProcess.launch(arguments: ["--tls-cert", certs + "/server.pem", "--tls-key", certs + "/server.key"])
        defer { server.stopInBackground() }
        let tls = ClientTLS(caFile: certs + "/ca.pem")
        let client = try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port, tls: tls)
        try await client.initialize(name: "tls-test")
        let thread = try #require(try await client.startThread(Wire.ThreadStartParams(name: "over tls")).thread?.id)
        _ = try await client.runTurn(thread, "hello over TLS")
        #expect(try await client.read(thread).thread?.turns.count == 1)

        let (status, output) = try await runCLI(["thread", "read", thread, "--server", "127.0.0.1:\(server.port)", "--tls-ca", certs + "/ca.pem"])
        #expect(status == 0)
        #expect(output.contains("over tls"))
        let (plainStatus, _) = try await runCLI(["thread", "read", thread, "--server", "127.0.0.1:\(server.port)"])
        #expect(plainStatus != 0)

        // A plain-TCP client's frames are not TLS: no frame ever comes back.
        let socket = try RawSocket(port: server.port)
        defer { socket.close() }
        try socket.send(RawSocket.initialize)
        let (envelopes, closed) = await socket.readUntilClosed(seconds: 10)
        #expect(closed)
        #expect(envelopes.isEmpty)
        #expect(await refused(server, ClientTLS(caFile: certs + "/rogue-ca.pem")))
        // The server is unharmed.
        #expect(try await client.read(thread).thread?.id == thread)
    }

    @Test("mutual TLS as meshes issue certificates: --tls-client-principal takes the principal from the SPIFFE ID (namespace/account), the URI or DNS SAN, or the common name; a certificate without that name is refused")
    func meshCertificates() async throws {
        let certs = try await makeCertificates()
        let carol = ClientTLS(caFile: certs + "/ca.pem", certificateFile: certs + "/carol.pem", keyFile: certs + "/carol.key")
        let alice = ClientTLS(caFile: certs + "/ca.pem", certificateFile: certs + "/alice.pem", keyFile: certs + "/alice.key")
        for (source, expected) in [("spiffe", "prod/carol"), ("uri", "spiffe://cluster.local/ns/prod/sa/carol"), ("dns", "carol.prod.svc"),
                                   ("cn", "workload-7")] {
            let server = try await ServerProcess.launch(arguments: [
                "--tls-cert", certs + "/server.pem", "--tls-key", certs + "/server.key", "--tls-client-ca", certs + "/ca.pem",
                "--tls-client-principal", source,
            ])
            defer { server.stopInBackground() }
            let client = try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port, tls: carol)
            guard case let .initialize(info) = try await client.result(initializeParams(token: nil)) else { throw UnexpectedResult(expected: "initialize") }
            #expect(info.principal == expected, "--tls-client-principal \(source)")
            if source != "cn" {
                // alice's certificate has no SAN of that kind: no principal, refused.
                let plain = try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port, tls: alice)
                #expect(try await plain.call(initializeParams(token: nil)).code == unauthenticated, "\(source): a certificate without the name")
            }
        }
        #expect(ClientCertificate.spiffeServiceAccount("spiffe://td/ns/a/sa/b") == "a/b")
        for other in ["spiffe://td/ns/a/sa/", "spiffe://td/ns/a/sa/b/c", "spiffe://td/x/a/sa/b", "https://td/ns/a/sa/b", "spiffe:///ns/a/sa/b"] {
            #expect(ClientCertificate.spiffeServiceAccount(other) == nil, "\(other)")
        }
    }

    @Test("mutual TLS: the certificate's common name is the principal; no certificate or another CA's is refused; a token must agree with the certificate")
    func mutualTLS() async throws {
        let certs = try await makeCertificates()
        let tokens = certs + "/tokens"
        try "alice \(aliceToken)\nbob \(bobToken)\n".write(toFile: tokens, atomically: true, encoding: .utf8)
        let server = try await ServerProcess.launch(arguments: [
            "--tls-cert", certs + "/server.pem", "--tls-key", certs + "/server.key", "--tls-client-ca", certs + "/ca.pem",
            "--auth-tokens", tokens,
        ])
        defer { server.stopInBackground() }
        func tls(_ name: String) -> ClientTLS {
            ClientTLS(caFile: certs + "/ca.pem", certificateFile: certs + "/\(name).pem", keyFile: certs + "/\(name).key")
        }
        let alice = try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port, tls: tls("alice"))
        guard case let .initialize(info) = try await alice.result(initializeParams(token: nil)) else { throw UnexpectedResult(expected: "initialize") }
        #expect(info.principal == "alice")
        let thread = try #require(try await alice.startThread().thread?.id)

        let bob = try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port, tls: tls("bob"))
        guard case let .initialize(bobInfo) = try await bob.result(initializeParams(token: nil)) else { throw UnexpectedResult(expected: "initialize") }
        #expect(bobInfo.principal == "bob")
        #expect(try await bob.call(.threadRead(Wire.ThreadReadParams(threadId: thread))).code == notFound)

        // bob's certificate with alice's token: refused.
        let mixed = try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port, tls: tls("bob"))
        #expect(try await mixed.call(initializeParams(token: aliceToken)).code == unauthenticated)

        #expect(await refused(server, ClientTLS(caFile: certs + "/ca.pem")))
        #expect(await refused(server, tls("mallory")), "CN=alice from another CA is not alice")
        #expect(try await alice.read(thread).thread?.id == thread)

        // The CLI presents its certificate too.
        let (status, output) = try await runCLI(["thread", "read", thread, "--server", "127.0.0.1:\(server.port)",
                                           "--tls-ca", certs + "/ca.pem", "--tls-cert", certs + "/alice.pem", "--tls-key", certs + "/alice.key"])
        #expect(status == 0)
        #expect(output.contains(thread))
    }
}
