import Foundation
import NIOConcurrencyHelpers
public import ThreadwireCore

/// Bearer tokens and the principals they name: `--auth-tokens FILE` (lines
/// of `principal token`, re-read on SIGHUP) and/or `THREADWIRE_AUTH_TOKEN`
/// (one token, principal `default`). Without either the server does not
/// authenticate and every connection acts as `Principal.standalone`.
///
/// Tokens are held only here and in the connection that presented them (to
/// close it if its token is revoked); no log line, error message or capture
/// file ever contains one.
public final class Authenticator: Sendable {
    public struct Entry: Sendable {
        public let principal: Principal
        let token: [UInt8]
    }

    /// Where the tokens come from.
    public let tokensFile: String?
    private let environmentToken: [UInt8]?
    private let entries: NIOLockedValueBox<[Entry]>
    /// Tokens shorter than this are refused at load: guessable.
    public static let minimumTokenBytes = 16

    /// No authentication: every connection is `Principal.standalone`.
    public static let disabled = try! Authenticator(tokensFile: nil, environmentToken: nil)

    public init(tokensFile: String?, environmentToken: String?) throws {
        self.tokensFile = tokensFile
        if let environmentToken {
            guard environmentToken.utf8.count >= Self.minimumTokenBytes, !environmentToken.contains(where: \.isWhitespace) else {
                throw AuthenticationSetupError(
                    "THREADWIRE_AUTH_TOKEN must be at least \(Self.minimumTokenBytes) bytes with no whitespace")
            }
            self.environmentToken = Array(environmentToken.utf8)
        } else {
            self.environmentToken = nil
        }
        entries = NIOLockedValueBox([])
        try reload()
    }

    /// Whether clients must present a token (or a client certificate).
    public var isEnabled: Bool { tokensFile != nil || environmentToken != nil }

    /// Principals with at least one token now.
    public var principals: Set<Principal> { Set(entries.withLockedValue { $0.map(\.principal) }) }

    /// Re-reads the tokens file. On any error the tokens in use stay as they
    /// were (a typo in the file never locks every client out).
    @discardableResult
    public func reload() throws -> Int {
        var loaded: [Entry] = []
        if let tokensFile {
            guard let data = FileManager.default.contents(atPath: tokensFile) else {
                throw AuthenticationSetupError("cannot read the tokens file \(tokensFile)")
            }
            loaded = try Self.parse(String(decoding: data, as: UTF8.self), origin: tokensFile)
        }
        if let environmentToken {
            if loaded.contains(where: { ConstantTime.equal($0.token, environmentToken) }) {
                throw AuthenticationSetupError("THREADWIRE_AUTH_TOKEN is also a token of \(tokensFile ?? "the tokens file")")
            }
            loaded.append(Entry(principal: .standalone, token: environmentToken))
        }
        let count = loaded.count
        entries.withLockedValue { $0 = loaded }
        return count
    }

    /// Lines of `principal token`; blank lines and lines starting with `#`
    /// are skipped. Errors name the line, never the token.
    public static func parse(_ text: String, origin: String) throws -> [Entry] {
        var result: [Entry] = []
        for (index, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let trimmed = line.trimmingCharacters(in: .whitespacesAndNewlines)
            if trimmed.isEmpty || trimmed.hasPrefix("#") { continue }
            let fields = trimmed.split(whereSeparator: \.isWhitespace)
            guard fields.count == 2 else {
                throw AuthenticationSetupError("\(origin) line \(index + 1): expected 'principal token' (two fields separated by spaces)")
            }
            let token = Array(fields[1].utf8)
            guard token.count >= minimumTokenBytes else {
                throw AuthenticationSetupError("\(origin) line \(index + 1): the token of \(fields[0]) is shorter than \(minimumTokenBytes) bytes")
            }
            if result.contains(where: { ConstantTime.equal($0.token, token) }) {
                throw AuthenticationSetupError("\(origin) line \(index + 1): this token is already given to another line; each token names one principal")
            }
            result.append(Entry(principal: String(fields[0]), token: token))
        }
        return result
    }

    /// The principal `token` names, or nil. Compares against every entry in
    /// constant time, without stopping at a match: the time taken depends
    /// only on the number of entries and the presented token's length.
    public func principal(presenting token: some Collection<UInt8>) -> Principal? {
        let presented = Array(token)
        return entries.withLockedValue { entries in
            var found: Principal?
            for entry in entries where ConstantTime.equal(entry.token, presented) {
                found = entry.principal
            }
            return found
        }
    }
}

public struct AuthenticationSetupError: Error, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}

/// Comparison whose time does not depend on where two byte strings differ.
public enum ConstantTime {
    /// True when `secret` and `presented` are equal. Reads every byte of
    /// `presented` whatever the content, so timing reveals neither a
    /// matching prefix nor the secret's length beyond "equal or not".
    public static func equal(_ secret: [UInt8], _ presented: [UInt8]) -> Bool {
        guard !secret.isEmpty else { return presented.isEmpty }
        var difference = UInt64(secret.count ^ presented.count)
        secret.withUnsafeBufferPointer { secret in
            presented.withUnsafeBufferPointer { presented in
                for index in 0..<presented.count {
                    difference |= UInt64(secret[index % secret.count] ^ presented[index])
                }
            }
        }
        return difference == 0
    }
}
