public import Foundation

/// Where JSON text went wrong, as an editor counts: Foundation reports a
/// byte offset ("around character 15") or only "end of file"; people fix a
/// file by line and column.
public enum JSONErrorPosition {
    /// A JSON parse error as "line L, column C: what".
    public static func describe(_ error: any Error, in data: Data) -> String {
        let debug = ((error as NSError).userInfo[NSDebugDescriptionErrorKey] as? String)
            ?? (error as? DecodingError).map(decodingDescription) ?? "\(error)"
        let offset: Int
        if let range = debug.range(of: #"character (\d+)"#, options: .regularExpression),
           let number = Int(debug[range].dropFirst("character ".count)) {
            offset = number
        } else if debug.contains("end of file") || debug.contains("Unexpected end") {
            offset = data.count
        } else {
            return debug
        }
        let (line, column) = lineAndColumn(ofByte: offset, in: data)
        let what = debug.replacingOccurrences(of: #" around character \d+"#, with: "", options: .regularExpression)
            .trimmingCharacters(in: CharacterSet(charactersIn: ". "))
        return "line \(line), column \(column): \(what)"
    }

    /// Where `data` stops being JSON, found by Foundation's parser (which
    /// reports an offset where JSONDecoder does not); nil when it is JSON.
    public static func locate(_ data: Data) -> String? {
        do {
            _ = try JSONSerialization.jsonObject(with: data, options: [.fragmentsAllowed])
            return nil
        } catch {
            return describe(error, in: data)
        }
    }

    /// 1-based line and column (in characters) of a byte offset.
    public static func lineAndColumn(ofByte offset: Int, in data: Data) -> (line: Int, column: Int) {
        let prefix = data.prefix(max(0, min(offset, data.count)))
        let lines = String(decoding: prefix, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false)
        return (lines.count, (lines.last?.count ?? 0) + 1)
    }

    static func decodingDescription(_ error: DecodingError) -> String {
        switch error {
        case .dataCorrupted(let context):
            return (context.underlyingError as NSError?)?.userInfo[NSDebugDescriptionErrorKey] as? String ?? context.debugDescription
        default:
            return "\(error)"
        }
    }
}
