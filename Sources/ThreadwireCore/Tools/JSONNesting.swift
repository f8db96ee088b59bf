/// How deep JSON text nests, counted in one pass without parsing it
/// (brackets inside strings do not count). Text from outside (a model's tool
/// arguments, a client's tool schema, a rollout line, an MCP server's
/// answer) is checked before any parser sees it: Foundation's parsers and
/// the decoders over them recurse once per level, so ten thousand levels
/// would take a thread's whole stack.
public enum JSONNesting {
    /// Deeper than any tool's arguments or any record codex writes.
    public static let limit = 64

    /// The deepest nesting of objects and arrays (0: none).
    public static func depth(_ bytes: some Sequence<UInt8>) -> Int {
        var depth = 0, deepest = 0
        var inString = false, escaped = false
        for byte in bytes {
            if inString {
                if escaped {
                    escaped = false
                } else if byte == UInt8(ascii: "\\") {
                    escaped = true
                } else if byte == UInt8(ascii: "\"") {
                    inString = false
                }
                continue
            }
            switch byte {
            case UInt8(ascii: "\""): inString = true
            case UInt8(ascii: "{"), UInt8(ascii: "["):
                depth += 1
                deepest = max(deepest, depth)
            case UInt8(ascii: "}"), UInt8(ascii: "]"): depth -= 1
            default: break
            }
        }
        return deepest
    }

    public static func tooDeep(_ text: String, limit: Int = limit) -> Bool { depth(text.utf8) > limit }
}
