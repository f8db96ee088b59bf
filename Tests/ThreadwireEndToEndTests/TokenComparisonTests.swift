import Foundation
import Testing
import ThreadwireServerTesting
import ThreadwireClient
import ThreadwireNIO
@testable import ThreadwireServer
import ThreadwireWire


@Suite("token comparison")
struct TokenComparisonTests {
    @Test("equal only for the same bytes, whatever the length or where they differ")
    func constantTimeEquality() {
        let secret = Array("alice-7f3c9a1e5b2d4c6f8a0e".utf8)
        #expect(ConstantTime.equal(secret, secret))
        var first = secret
        first[0] ^= 1
        var last = secret
        last[last.count - 1] ^= 1
        #expect(!ConstantTime.equal(secret, first))
        #expect(!ConstantTime.equal(secret, last))
        #expect(!ConstantTime.equal(secret, Array(secret.dropLast())))
        #expect(!ConstantTime.equal(secret, secret + secret))
        #expect(!ConstantTime.equal(secret, []))
        // A repetition of the secret is not the secret (the index wraps).
        #expect(!ConstantTime.equal(Array("ab".utf8), Array("abab".utf8)))
    }

    @Test("a tokens file maps each token to its principal; bad lines are refused naming the line, never the token")
    func tokensFile() throws {
        let entries = try Authenticator.parse("# comment\n\nalice \(aliceToken)\n  bob   \(bobToken)  \n", origin: "tokens")
        #expect(entries.map(\.principal) == ["alice", "bob"])
        for (text, line) in [("alice\n", 1), ("x\nalice short\n", 1), ("alice \(aliceToken)\nbob \(aliceToken)\n", 2)] {
            do {
                _ = try Authenticator.parse(text, origin: "tokens")
                Issue.record("accepted \(text)")
            } catch {
                #expect("\(error)".contains("tokens line \(line)"), "\(error)")
                #expect(!"\(error)".contains(aliceToken))
            }
        }
    }

    @Test("a third field 'operator' marks a principal an operator (hashed or plain); any other third field is refused naming the line")
    func operatorMark() throws {
        let entries = try Authenticator.parse("alice \(aliceToken) operator\nbob \(bobToken)\n", origin: "tokens")
        #expect(entries.map(\.principal) == ["alice", "bob"])
        #expect(entries.map(\.isOperator) == [true, false])
        for text in ["alice \(aliceToken) admin\n", "alice \(aliceToken) operator extra\n"] {
            do {
                _ = try Authenticator.parse(text, origin: "tokens")
                Issue.record("accepted \(text)")
            } catch {
                #expect("\(error)".contains("tokens line 1"), "\(error)")
                #expect(!"\(error)".contains(aliceToken))
            }
        }
    }

    @Test("a token given as sha256:HEX in the tokens file authenticates its principal when presented plainly; a wrong token, a malformed hash and a token given twice (once hashed) are refused")
    func hashedTokens() async throws {
        let hash = Authenticator.digest(Array(aliceToken.utf8)).map { String(format: "%02x", $0) }.joined()
        let entries = try Authenticator.parse("alice sha256:\(hash)\nbob \(bobToken)\n", origin: "tokens")
        #expect(entries.map(\.principal) == ["alice", "bob"])
        for (text, line) in [("alice sha256:abc\n", 1), ("alice sha256:\(hash.dropLast(2))zz\n", 1),
                             ("alice \(aliceToken)\ncarol sha256:\(hash.uppercased())\n", 2)] {
            do {
                _ = try Authenticator.parse(text, origin: "tokens")
                Issue.record("accepted \(text)")
            } catch {
                #expect("\(error)".contains("tokens line \(line)"), "\(error)")
            }
        }
        // Through the real server: the file holds only the hash.
        let tokens = NSTemporaryDirectory() + "threadwire-hashed-tokens-" + UUID().uuidString
        try "alice sha256:\(hash)\nbob \(bobToken)\n".write(toFile: tokens, atomically: true, encoding: .utf8)
        chmod(tokens, 0o600)
        defer { try? FileManager.default.removeItem(atPath: tokens) }
        let server = try await ServerProcess.launch(arguments: ["--auth-tokens", tokens])
        defer { server.stopInBackground() }
        let alice = try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port)
        #expect(try await alice.initialize(name: "hashed", authToken: aliceToken).principal == "alice")
        #expect(try await alice.startThread(Wire.ThreadStartParams()).thread?.id != nil)
        let wrong = try await ThreadwireClient.connect(host: "127.0.0.1", port: server.port)
        await expectStatus(unauthenticated, mentioning: "not valid") { _ = try await wrong.initialize(name: "wrong", authToken: hash) }
    }
}
