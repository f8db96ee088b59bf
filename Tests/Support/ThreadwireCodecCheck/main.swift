// Exercises the protobuf-c codec for memory checkers (valgrind, sanitizers):
// every populated message round-trips, and random and mutated bytes decode to
// a value or a typed error, never a crash, leak or invalid access.
// Usage: threadwire-codec-check [ITERATIONS]
import ThreadwireWire
import ThreadwireWireFixtures

let iterations = CommandLine.arguments.count > 1 ? Int(CommandLine.arguments[1]) ?? 100 : 100
var failures = 0
var generator = SystemRandomNumberGenerator()

for (name, run) in WireFixtures.checks {
    do {
        if try !run() { print("round trip changed \(name)"); failures += 1 }
    } catch {
        print("round trip failed \(name): \(error)"); failures += 1
    }
}

// One representative envelope, mutated byte by byte and truncated at every length.
let seed = Wire.Envelope(kind: .request(WireFixtures.Request(12))).serializedBytes()
var decodedOK = 0, rejected = 0
for iteration in 0..<iterations {
    var bytes = seed
    for _ in 0..<(1 + iteration % 4) {
        bytes[Int.random(in: 0..<bytes.count, using: &generator)] = UInt8.random(in: 0...255, using: &generator)
    }
    let random = (0..<Int.random(in: 0..<64, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
    for candidate in [bytes, Array(seed.prefix(iteration % seed.count)), random] {
        if (try? Wire.Envelope(serializedBytes: candidate)) != nil { decodedOK += 1 } else { rejected += 1 }
    }
}
// A string field carrying invalid UTF-8 must be a typed error.
let badUTF8: [UInt8] = [0x0A, 0x03, 0xFF, 0xFE, 0x41]  // KeyValue.key = FF FE 41
do {
    _ = try Wire.KeyValue(serializedBytes: badUTF8)
    print("invalid UTF-8 was accepted"); failures += 1
} catch WireError.invalidUTF8 {
} catch {
    print("invalid UTF-8 gave \(error)"); failures += 1
}

print("codec check: \(WireFixtures.checks.count) round trips, \(decodedOK) mutated inputs decoded, \(rejected) rejected, \(failures) failures")
if failures > 0 { fatalError("codec check failed") }
