module github.com/threadwire/threadwire/clients/go

go 1.19

require google.golang.org/protobuf v1.28.1

// Offline builds (no module proxy) use Debian's golang-google-protobuf-dev;
// see README.md to build against the module proxy instead.
replace google.golang.org/protobuf => /usr/share/gocode/src/google.golang.org/protobuf
