// swift-tools-version:6.0
import PackageDescription

// Benchmarks live apart so gRPC and swift-protobuf never slow the main build or `make test`.
let package = Package(
    name: "threadwire-benchmarks",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(name: "threadwire", path: ".."),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-protobuf", from: "1.39.0"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/grpc/grpc-swift-2", from: "2.4.3"),
        .package(url: "https://github.com/grpc/grpc-swift-nio-transport", from: "2.9.2"),
        .package(url: "https://github.com/HdrHistogram/hdrhistogram-swift", from: "0.2.0"),
        .package(url: "https://github.com/hummingbird-project/swift-websocket", from: "1.6.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
    ],
    targets: [
        .executableTarget(
            name: "ThreadwireBench",
            dependencies: [
                .product(name: "ThreadwireWire", package: "threadwire"),
                .product(name: "ThreadwireCore", package: "threadwire"),
                .product(name: "ThreadwireModels", package: "threadwire"),
                .product(name: "ThreadwireContract", package: "threadwire"),
                .product(name: "ThreadwireSQLite", package: "threadwire"),
                .product(name: "ThreadwireNIO", package: "threadwire"),
                .product(name: "ThreadwireClient", package: "threadwire"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "SwiftProtobuf", package: "swift-protobuf"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "GRPCCore", package: "grpc-swift-2"),
                .product(name: "GRPCNIOTransportHTTP2", package: "grpc-swift-nio-transport"),
                .product(name: "Histogram", package: "hdrhistogram-swift"),
                .product(name: "WSClient", package: "swift-websocket"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
    ]
)
