module github.com/threadwire/threadwire/clients/go

go 1.19

require (
	google.golang.org/grpc v1.33.3
	google.golang.org/protobuf v1.28.1
)

require (
	github.com/golang/protobuf v1.5.2 // indirect
	golang.org/x/net v0.3.0 // indirect
	golang.org/x/sys v0.5.0 // indirect
	golang.org/x/text v0.7.0 // indirect
	google.golang.org/genproto v0.0.0-20200526211855-cb27e3aa2013 // indirect
)

// Offline builds (no module proxy) use Debian's Go sources
// (golang-google-protobuf-dev, golang-google-grpc-dev and what it depends
// on); the modules Debian does not ship are only in grpc's requirement graph
// and stand in as empty modules under offline/. With a module proxy, delete
// this block and run `go mod tidy` (README.md).
replace (
	cloud.google.com/go/compute/metadata => ./offline/cloud.google.com/go/compute/metadata
	github.com/cncf/udpa/go => ./offline/github.com/cncf/udpa/go
	github.com/envoyproxy/go-control-plane => ./offline/github.com/envoyproxy/go-control-plane
	github.com/golang/glog => ./offline/github.com/golang/glog
	github.com/golang/protobuf => /usr/share/gocode/src/github.com/golang/protobuf
	github.com/google/go-cmp => /usr/share/gocode/src/github.com/google/go-cmp
	github.com/google/uuid => ./offline/github.com/google/uuid
	golang.org/x/lint => ./offline/golang.org/x/lint
	golang.org/x/mod => ./offline/golang.org/x/mod
	golang.org/x/net => /usr/share/gocode/src/golang.org/x/net
	golang.org/x/oauth2 => /usr/share/gocode/src/golang.org/x/oauth2
	golang.org/x/sys => /usr/share/gocode/src/golang.org/x/sys
	golang.org/x/term => ./offline/golang.org/x/term
	golang.org/x/text => /usr/share/gocode/src/golang.org/x/text
	golang.org/x/tools => ./offline/golang.org/x/tools
	google.golang.org/appengine => ./offline/google.golang.org/appengine
	google.golang.org/genproto => /usr/share/gocode/src/google.golang.org/genproto
	google.golang.org/grpc => /usr/share/gocode/src/google.golang.org/grpc
	google.golang.org/protobuf => /usr/share/gocode/src/google.golang.org/protobuf
	honnef.co/go/tools => ./offline/honnef.co/go/tools
)
