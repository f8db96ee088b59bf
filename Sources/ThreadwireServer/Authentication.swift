import Crypto
import Foundation
import NIOConcurrencyHelpers
import Synchronization
public import ThreadwireCore

/// Bearer tokens and the principals they name: `--auth-tokens FILE` (lines
/// of `principal token`, or `principal sha256:HEX` so the file holds no
/// usable secret; re-read on SIGHUP) and/or `THREADWIRE_AUTH_TOKEN`
/// (one token, principal `default`). Without either the server does not
/// authenticate and every connection acts as `Principal.standalone`.
///
/// Tokens are held only here and in the connection that presented them (to
/// close it if its token is revoked); no log line, error message or capture
/// file ever contains one.
public final class Authenticator: Sendable {
    public struct Entry: Sendable {
        public let principal: Principal
        /// The token itself, or (`hashed`) its SHA-256.
        let token: [UInt8]
        let hashed: Bool
        /// Marked `operator`: the principal may read every principal's threads.
        let isOperator: Bool

        init(principal: Principal, token: [UInt8], hashed: Bool = false, isOperator: Bool = false) {
            self.principal = principal
            self.token = token
            self.hashed = hashed
            self.isOperator = isOperator
        }

        /// Whether `presented` (and `digest`, its SHA-256) is this entry's token.
        func matches(_ presented: [UInt8], digest: [UInt8]) -> Bool {
            ConstantTime.equal(token, hashed ? digest : presented)
        }
    }

    static func digest(_ token: [UInt8]) -> [UInt8] { Array(SHA256.hash(data: token)) }

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

    /// Whether a line of the tokens file marks `principal` as an operator
    /// (read as of now: a SIGHUP reload that drops the mark takes it away).
    public func isOperator(_ principal: Principal) -> Bool {
        // Without operators (the common case) no lock is taken: reads ask this.
        guard anyOperator.load(ordering: .relaxed) else { return false }
        return entries.withLockedValue { $0.contains { $0.isOperator && $0.principal == principal } }
    }
    private let anyOperator = Atomic<Bool>(false)

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
            if loaded.contains(where: { $0.matches(environmentToken, digest: Self.digest(environmentToken)) }) {
                throw AuthenticationSetupError("THREADWIRE_AUTH_TOKEN is also a token of \(tokensFile ?? "the tokens file")")
            }
            loaded.append(Entry(principal: .standalone, token: environmentToken))
        }
        let count = loaded.count
        entries.withLockedValue { $0 = loaded }
        anyOperator.store(loaded.contains(where: \.isOperator), ordering: .relaxed)
        return count
    }

    /// Lines of `principal token`, or `principal token operator` for a
    /// principal that may read every principal's threads; blank lines and
    /// lines starting with `#` are skipped. Errors name the line, never the token.
    public static func parse(_ text: String, origin: String) throws -> [Entry] {
        var result: [Entry] = []
        for (index, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let trimmed = line.trimmingCharacters(in: .whitespacesAndNewlines)
            if trimmed.isEmpty || trimmed.hasPrefix("#") { continue }
            let fields = trimmed.split(whereSeparator: \.isWhitespace)
            guard fields.count == 2 || fields.count == 3 else {
                throw AuthenticationSetupError(
                    "\(origin) line \(index + 1): expected 'principal token' or 'principal token operator' (fields separated by spaces)")
            }
            guard fields.count == 2 || fields[2] == "operator" else {
                throw AuthenticationSetupError("\(origin) line \(index + 1): the third field may only be 'operator', got '\(fields[2].prefix(40))'")
            }
            let isOperator = fields.count == 3
            let entry: Entry
            if fields[1].hasPrefix("sha256:") {
                guard let digest = hexBytes(fields[1].dropFirst("sha256:".count)), digest.count == 32 else {
                    throw AuthenticationSetupError(
                        "\(origin) line \(index + 1): the token of \(fields[0]) starts with sha256: but is not 64 hexadecimal digits")
                }
                entry = Entry(principal: String(fields[0]), token: digest, hashed: true, isOperator: isOperator)
            } else {
                let token = Array(fields[1].utf8)
                guard token.count >= minimumTokenBytes else {
                    throw AuthenticationSetupError("\(origin) line \(index + 1): the token of \(fields[0]) is shorter than \(minimumTokenBytes) bytes")
                }
                entry = Entry(principal: String(fields[0]), token: token, isOperator: isOperator)
            }
            // One token on two lines, given plainly or hashed either way.
            let key = entry.hashed ? entry.token : digest(entry.token)
            if result.contains(where: { ($0.hashed ? $0.token : digest($0.token)) == key }) {
                throw AuthenticationSetupError("\(origin) line \(index + 1): this token is already given to another line; each token names one principal")
            }
            result.append(entry)
        }
        return result
    }

    /// The principal `token` names, or nil. Compares against every entry in
    /// constant time, without stopping at a match: the time taken depends
    /// only on the number of entries and the presented token's length.
    public func principal(presenting token: some Collection<UInt8>) -> Principal? {
        let presented = Array(token)
        return entries.withLockedValue { entries in
            // Hashed once, only when some entry is hashed (a token costs no hash otherwise).
            let digest = entries.contains(where: \.hashed) ? Self.digest(presented) : []
            var found: Principal?
            for entry in entries where entry.matches(presented, digest: digest) {
                found = entry.principal
            }
            return found
        }
    }

    private static func hexBytes(_ text: Substring) -> [UInt8]? {
        let digits = Array(text.utf8)
        guard digits.count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(digits.count / 2)
        for pair in stride(from: 0, to: digits.count, by: 2) {
            guard let high = hexValue(digits[pair]), let low = hexValue(digits[pair + 1]) else { return nil }
            bytes.append(high << 4 | low)
        }
        return bytes
    }

    private static func hexValue(_ digit: UInt8) -> UInt8? {
        switch digit {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): digit - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): digit - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): digit - UInt8(ascii: "A") + 10
        default: nil
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
