import Foundation
import HTTPTypes
import Hummingbird
import NIOCore

/// The operator's console (clients/typescript/console), served by the web
/// listener from the files embedded at build time (ConsoleAssets): `/` is
/// the page, the rest its modules and style. The page itself holds no data:
/// everything it shows comes over /ws under the token it signs in with.
enum ConsoleFiles {
    struct File: Sendable {
        let contentType: String
        let etag: String
        let body: ByteBuffer
    }

    static let files: [String: File] = {
        var files: [String: File] = [:]
        for (path, asset) in ConsoleAssets.files {
            let bytes = Data(base64Encoded: asset.base64) ?? Data()
            files[path] = File(contentType: asset.contentType, etag: asset.etag, body: ByteBuffer(bytes: bytes))
        }
        files["/"] = files["/index.html"]
        return files
    }()

    /// Scripts, styles and connections of this origin only; no inline script
    /// or style, no frames, no forms posting elsewhere.
    static let contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
        + "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

    static func headers(contentType: String) -> HTTPFields {
        var headers = HTTPFields()
        headers[.contentType] = contentType
        headers[.contentSecurityPolicy] = contentSecurityPolicy
        headers[.xContentTypeOptions] = "nosniff"
        headers[HTTPField.Name("X-Frame-Options")!] = "DENY"
        headers[HTTPField.Name("Referrer-Policy")!] = "no-referrer"
        return headers
    }

    /// The file at `path`, or 404; 304 when the browser's copy is current
    /// (every response is revalidated: `no-cache` with an ETag, so a new
    /// build's console is picked up at once and an unchanged one costs a 304).
    static func response(to request: Request) -> Response {
        guard let file = files[request.uri.path] else {
            var headers = headers(contentType: "text/plain; charset=utf-8")
            headers[.cacheControl] = "no-store"
            return Response(status: .notFound, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(string: "not found\n")))
        }
        var headers = headers(contentType: file.contentType)
        headers[.cacheControl] = "no-cache"
        headers[.eTag] = file.etag
        if let presented = request.headers[.ifNoneMatch], presented.split(separator: ",").contains(where: { $0.trimmingCharacters(in: .whitespaces) == file.etag }) {
            return Response(status: .notModified, headers: headers)
        }
        return Response(status: .ok, headers: headers, body: ResponseBody(byteBuffer: file.body))
    }
}
