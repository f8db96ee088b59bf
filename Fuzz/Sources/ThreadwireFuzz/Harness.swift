// libFuzzer harnesses for the decoders a client can reach. One binary, three
// harnesses, chosen with THREADWIRE_FUZZ_HARNESS (frames, envelope, json):
//   frames    arbitrary bytes, in arbitrary splits, through the server's frame
//             decoder (64 KiB limit, bytes cumulated across reads); every
//             frame it yields is decoded as an Envelope like the server does.
//   envelope  bytes -> Envelope; whatever decodes must re-encode and decode to
//             an equal value, and survive the JSON mapping the same way.
//   json      text -> JSONValue -> Envelope (the CLI's path); whatever maps must
//             map back and forth to an equal value, and through binary too.
// A broken invariant prints what broke and aborts, which libFuzzer reports as
// a crash with the input that caused it (release builds drop precondition
// messages, hence `require`).
import CFuzzEntry
import NIOCore
import ThreadwireNIO
import ThreadwireWire

#if canImport(Glibc)
import Glibc
#endif

enum Harness: String {
    case frames, envelope, json
}

let harness: Harness = {
    guard let name = getenv("THREADWIRE_FUZZ_HARNESS").map({ String(cString: $0) }) else { return .envelope }
    guard let harness = Harness(rawValue: name) else { fatalError("THREADWIRE_FUZZ_HARNESS must be frames, envelope or json, not \(name)") }
    return harness
}()

func require(_ condition: Bool, _ message: @autoclosure () -> String) {
    if !condition { failure(message()) }
}

func failure(_ message: String) -> Never {
    let line = Array("threadwire fuzz: \(message)\n".utf8)
    _ = line.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
    abort()
}

@_cdecl("LLVMFuzzerTestOneInput")
public func threadwireFuzzOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let bytes = UnsafeRawBufferPointer(start: data, count: size)
    switch harness {
    case .frames: fuzzFrames(bytes)
    case .envelope: fuzzEnvelope(bytes)
    case .json: fuzzJSON(bytes)
    }
    return 0
}

/// Decodes must be repeatable: equal bytes, equal values, both ways.
func checkRoundTrips(_ envelope: Wire.Envelope) {
    guard let again = try? Wire.Envelope(serializedBytes: envelope.serializedBytes()) else {
        failure("a decoded envelope did not decode after re-encoding: \(envelope)")
    }
    require(again == envelope, "binary round trip changed \(envelope) into \(again)")
    guard let fromJSON = try? Wire.Envelope(json: envelope.jsonValue(), path: "") else {
        failure("a decoded envelope's JSON did not map back: \(envelope.jsonValue())")
    }
    require(fromJSON == envelope, "JSON round trip changed \(envelope) into \(fromJSON)")
}

func fuzzEnvelope(_ bytes: UnsafeRawBufferPointer) {
    guard let envelope = try? Wire.Envelope(serializedBytes: bytes) else { return }
    checkRoundTrips(envelope)
}

func fuzzJSON(_ bytes: UnsafeRawBufferPointer) {
    let text = String(decoding: bytes, as: UTF8.self)
    guard let json = try? JSONValue.parse(text), let envelope = try? Wire.Envelope(json: json, path: "") else { return }
    // What the CLI prints must parse back to the same message (object key
    // order is not part of JSON, and the parser sorts keys).
    let printed = envelope.jsonValue().render()
    guard let reparsed = try? JSONValue.parse(printed), let again = try? Wire.Envelope(json: reparsed, path: "") else {
        failure("printed JSON did not parse back: \(printed)")
    }
    require(again == envelope, "printed JSON \(printed) parsed to \(again)")
    checkRoundTrips(envelope)
}

let frameLimit = 64 * 1024

func fuzzFrames(_ bytes: UnsafeRawBufferPointer) {
    guard bytes.count >= 2 else { return }
    // The first two bytes seed the split sizes of the rest; the decoder sees
    // the bytes as a connection's reads cumulate them (as ByteToMessageHandler
    // does), frame by frame.
    var seed = UInt32(bytes[0]) << 8 | UInt32(bytes[1]) | 1
    let payload = bytes.dropFirst(2)
    var cumulation = ByteBufferAllocator().buffer(capacity: 0)
    var offset = payload.startIndex
    while offset < payload.endIndex {
        seed = seed &* 1_103_515_245 &+ 12_345
        let chunk = min(payload.endIndex - offset, Int(seed >> 16) % 64 + 1)
        cumulation.writeBytes(UnsafeRawBufferPointer(rebasing: payload[offset..<(offset + chunk)]))
        offset += chunk
        do {
            while let frame = try FrameDecoder.nextFrame(&cumulation, maxFrameBytes: frameLimit) {
                require(frame.readableBytes <= frameLimit, "a frame over the limit came through: \(frame.readableBytes)")
                let envelope = frame.withUnsafeReadableBytes { try? Wire.Envelope(serializedBytes: $0) }
                if let envelope { checkRoundTrips(envelope) }
            }
        } catch is FrameError {
            return  // the server answers the error and closes the connection here
        } catch {
            failure("the frame decoder threw something other than a FrameError: \(error)")
        }
        // What waits is at most one frame that is not complete yet.
        require(cumulation.readableBytes < Framing.headerSize + frameLimit, "\(cumulation.readableBytes) bytes held")
        cumulation.discardReadBytes()
    }
}
