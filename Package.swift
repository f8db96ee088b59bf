// swift-tools-version:6.1
import PackageDescription

// Dependencies point one way (docs/architecture.md): CThreadwireProto ->
// ThreadwireWire (the codec, the only module that sees C) ; ThreadwireCore
// (domain, no I/O) ; ThreadwireStorage (rows, record format) ; the stores
// (SQLite, PostgreSQL) -> Core + Storage ; ThreadwireNIO (framing) ->
// ThreadwireTransport (listening, TLS, flow control) ; ThreadwireServer (the
// call layer) -> all of them ; ThreadwireServerCommand (flags -> services)
// and the executables on top.
let swiftSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("InternalImportsByDefault"),
]

let package = Package(
    name: "threadwire",
    platforms: [.macOS(.v14)],
    products: [
        .executable(name: "threadwire-server", targets: ["ThreadwireServerMain"]),
        .executable(name: "threadwire", targets: ["ThreadwireCLI"]),
        .library(name: "ThreadwireWire", targets: ["ThreadwireWire"]),
        .library(name: "ThreadwireCore", targets: ["ThreadwireCore"]),
        .library(name: "ThreadwireContract", targets: ["ThreadwireContract"]),
        .library(name: "ThreadwireSQLite", targets: ["ThreadwireSQLite"]),
        .library(name: "ThreadwirePostgres", targets: ["ThreadwirePostgres"]),
        .library(name: "ThreadwireNIO", targets: ["ThreadwireNIO"]),
        .library(name: "ThreadwireModels", targets: ["ThreadwireModels"]),
        .library(name: "ThreadwireClient", targets: ["ThreadwireClient"]),
        .executable(name: "threadwire-codec-check", targets: ["ThreadwireCodecCheck"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        .package(url: "https://github.com/HdrHistogram/hdrhistogram-swift", from: "0.2.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.37.6"),
        .package(url: "https://github.com/vapor/postgres-nio", from: "1.33.2"),
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
        .package(url: "https://github.com/modelcontextprotocol/swift-sdk", from: "0.12.1"),
        .package(url: "https://github.com/apple/swift-system", from: "1.8.1"),
        .package(url: "https://github.com/apple/swift-distributed-tracing", from: "1.7.3"),
        // OTLP/HTTP only: its default traits would also build a gRPC stack.
        .package(url: "https://github.com/swift-otel/swift-otel", from: "1.6.0", traits: ["OTLPHTTP"]),
        // SHA-256 of idempotent requests (already in the graph through postgres-nio).
        .package(url: "https://github.com/apple/swift-crypto", from: "4.5.2"),
        .package(url: "https://github.com/apple/swift-certificates", from: "1.21.1"),
    ],
    targets: [
        // protoc-c output (committed; regenerate with codegen/generate.sh).
        .target(
            name: "CThreadwireProto",
            path: "Sources/CThreadwireProto",
            linkerSettings: [.linkedLibrary("protobuf-c")]
        ),
        .target(
            name: "ThreadwireWire",
            dependencies: ["CThreadwireProto"],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ThreadwireWireFixtures",
            dependencies: ["ThreadwireWire"],
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "ThreadwireCodecCheck",
            dependencies: ["ThreadwireWire", "ThreadwireWireFixtures"],
            swiftSettings: swiftSettings
        ),
        // The domain; tracing is only its API (spans go nowhere unless the
        // executable installs a tracer).
        .target(
            name: "ThreadwireCore",
            dependencies: [.product(name: "Tracing", package: "swift-distributed-tracing"), .product(name: "Crypto", package: "swift-crypto")],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ThreadwireContract",
            dependencies: ["ThreadwireCore", "ThreadwireWire", .product(name: "Crypto", package: "swift-crypto")],
            swiftSettings: swiftSettings
        ),
        // What every store shares: the thread row's columns and the on-disk
        // format of history items and turns (the stores only move bytes).
        .target(
            name: "ThreadwireStorage",
            dependencies: ["ThreadwireCore", "ThreadwireWire", "ThreadwireContract"],
            swiftSettings: swiftSettings
        ),
        // The SQLite store (the embedded default).
        .target(
            name: "ThreadwireSQLite",
            dependencies: [
                "ThreadwireCore", "ThreadwireStorage",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
            ],
            swiftSettings: swiftSettings
        ),
        // The PostgreSQL store (several instances on one database).
        .target(
            name: "ThreadwirePostgres",
            dependencies: [
                "ThreadwireCore", "ThreadwireStorage",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: swiftSettings
        ),
        // Model providers: OpenAI-compatible Chat Completions, streamed.
        .target(
            name: "ThreadwireModels",
            dependencies: [
                "ThreadwireCore",
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        // MCP tool servers: one supervised process per configured server,
        // shared by every thread (the MCP Swift SDK over stdio).
        .target(
            name: "ThreadwireMCP",
            dependencies: [
                "ThreadwireCore",
                .product(name: "MCP", package: "swift-sdk"),
                .product(name: "SystemPackage", package: "swift-system"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
            ],
            swiftSettings: swiftSettings
        ),
        // How clients reach the server: TCP (listener, TLS, descriptor
        // reserve) or in process; flow control; no protobuf.
        .target(
            name: "ThreadwireTransport",
            dependencies: [
                "ThreadwireNIO",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "X509", package: "swift-certificates"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ThreadwireServer",
            dependencies: [
                "ThreadwireCore", "ThreadwireWire", "ThreadwireContract", "ThreadwireNIO", "ThreadwireClient",
                "ThreadwireTransport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: swiftSettings
        ),
        // The operator's HTTP endpoint: liveness, readiness, Prometheus metrics.
        .target(
            name: "ThreadwireAdmin",
            dependencies: [
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ThreadwireNIO",
            dependencies: [.product(name: "NIOCore", package: "swift-nio")],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ThreadwireClient",
            dependencies: [
                "ThreadwireWire", "ThreadwireNIO",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ],
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "ThreadwireServerMain",
            dependencies: ["ThreadwireServerCommand"],
            swiftSettings: swiftSettings
        ),
        // threadwire-server's flags and the services they compose (a library:
        // tests run the same composition in process).
        .target(
            name: "ThreadwireServerCommand",
            dependencies: [
                "ThreadwireModels", "ThreadwireMCP", "ThreadwireTransport", "ThreadwireNIO",
                "ThreadwireServer", "ThreadwireSQLite", "ThreadwirePostgres", "ThreadwireCore", "ThreadwireAdmin", "ThreadwireClient",
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "OTel", package: "swift-otel"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
            ],
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "ThreadwireCLI",
            dependencies: [
                "ThreadwireClient", "ThreadwireWire", "ThreadwireSQLite", "ThreadwireCore", "ThreadwireNIO", "ThreadwireContract",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Histogram", package: "hdrhistogram-swift"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "ThreadwireWireTests",
            dependencies: ["ThreadwireWire", "ThreadwireWireFixtures"],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ThreadwireTesting",
            dependencies: ["ThreadwireCore", "ThreadwirePostgres", "ThreadwireStorage", .product(name: "Logging", package: "swift-log")],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "ThreadwireCoreTests",
            dependencies: ["ThreadwireCore", "ThreadwireTesting", "ThreadwireModels"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "ThreadwireModelsTests",
            dependencies: ["ThreadwireModels", "ThreadwireCore", .product(name: "Logging", package: "swift-log")],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "ThreadwireStoreTests",
            dependencies: ["ThreadwireSQLite", "ThreadwirePostgres", "ThreadwireStorage", "ThreadwireCore", "ThreadwireTesting", "ThreadwireContract", "ThreadwireWire",
                           .product(name: "Logging", package: "swift-log"), .product(name: "PostgresNIO", package: "postgres-nio"),
                           .product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOPosix", package: "swift-nio")],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "ThreadwireServerTests",
            dependencies: [
                "ThreadwireModels", .product(name: "AsyncHTTPClient", package: "async-http-client"),
                "ThreadwireServer", "ThreadwireWire", "ThreadwireCore", "ThreadwireSQLite", "ThreadwireClient", "ThreadwireNIO",
                "ThreadwireTesting", "ThreadwireContract", "ThreadwireTransport", "ThreadwireServerCommand",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: swiftSettings
        ),
    ]
)
