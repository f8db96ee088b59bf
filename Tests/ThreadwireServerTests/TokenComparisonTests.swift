import Foundation
import Testing
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
}
