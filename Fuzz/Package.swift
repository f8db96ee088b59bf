// swift-tools-version:6.0
import PackageDescription

// Coverage-guided fuzzing of the decoders (libFuzzer). Built apart, only with
// `-sanitize=fuzzer,address` (`make fuzz`): the harness has no `main`, libFuzzer
// provides it, so it is never one of the normal build products.
let package = Package(
    name: "threadwire-fuzz",
    dependencies: [
        .package(name: "threadwire", path: ".."),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
    ],
    targets: [
        .target(name: "CFuzzEntry"),
        .executableTarget(
            name: "ThreadwireFuzz",
            dependencies: [
                "CFuzzEntry",
                .product(name: "ThreadwireWire", package: "threadwire"),
                .product(name: "ThreadwireNIO", package: "threadwire"),
                .product(name: "NIOCore", package: "swift-nio"),
            ]
        ),
    ]
)
