module cloud.google.com/go/compute/metadata

// An empty stand-in: this module is only in the requirement graph of
// google.golang.org/grpc 1.33 (no package of it is built); see ../README.md.
