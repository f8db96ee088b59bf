module github.com/threadwire/threadwire/benchmarks/go

go 1.19

require (
	github.com/threadwire/threadwire/clients/go v0.0.0
	google.golang.org/protobuf v1.28.1
)

replace (
	github.com/threadwire/threadwire/clients/go => ../../clients/go
	google.golang.org/protobuf => /usr/share/gocode/src/google.golang.org/protobuf
)
