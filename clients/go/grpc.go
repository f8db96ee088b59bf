package threadwire

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"

	pb "github.com/threadwire/threadwire/clients/go/threadwirepb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// GRPCClient speaks to the server's gRPC listener (--grpc-listen): the
// standard stubs protoc-gen-go-grpc generates from
// proto/threadwire/v1/service.proto (every method a unary call, plus the
// Subscribe, Connect and ThreadImportStream streams), dialled with what
// threadwire needs. Errors are gRPC status errors; CodeOf reads them too.
//
// Use it where a gRPC stack is wanted (a mesh routing per call, Envoy's
// per-method stats, grpc-go's interceptors); Dial's frame client pipelines
// on one TCP connection and answers the server's calls (WithHandlers).
type GRPCClient struct {
	pb.ThreadwireClient
	conn *grpc.ClientConn
}

type grpcOptions struct {
	tls     *tls.Config
	token   string
	options []grpc.DialOption
}

// GRPCOption configures DialGRPC.
type GRPCOption func(*grpcOptions)

// GRPCWithToken sends `authorization: Bearer TOKEN` with every call.
func GRPCWithToken(token string) GRPCOption { return func(o *grpcOptions) { o.token = token } }

// GRPCWithTLS speaks TLS (add Certificates for mutual TLS); without it the
// connection is HTTP/2 in cleartext (h2c), as the listener serves without --tls-cert.
func GRPCWithTLS(config *tls.Config) GRPCOption { return func(o *grpcOptions) { o.tls = config } }

// GRPCWithDialOptions adds grpc-go dial options (interceptors, keepalive, ...).
func GRPCWithDialOptions(options ...grpc.DialOption) GRPCOption {
	return func(o *grpcOptions) { o.options = append(o.options, options...) }
}

// DialGRPC connects to target ("host:port" of --grpc-listen). ctx bounds
// the connection: DialGRPC returns once it is up, or with UNAVAILABLE.
func DialGRPC(ctx context.Context, target string, opts ...GRPCOption) (*GRPCClient, error) {
	var o grpcOptions
	for _, opt := range opts {
		opt(&o)
	}
	// grpc-go 1.33 (Debian's) marshals through github.com/golang/protobuf
	// 1.3, which cannot encode the oneofs of APIv2 messages: this codec
	// uses google.golang.org/protobuf itself.
	dial := []grpc.DialOption{grpc.WithBlock(), grpc.WithDefaultCallOptions(grpc.ForceCodec(protoCodec{}))}
	if o.tls != nil {
		dial = append(dial, grpc.WithTransportCredentials(credentials.NewTLS(o.tls)))
	} else {
		dial = append(dial, grpc.WithInsecure())
	}
	if o.token != "" {
		dial = append(dial, grpc.WithPerRPCCredentials(bearerToken{token: o.token}))
	}
	conn, err := grpc.DialContext(ctx, target, append(dial, o.options...)...)
	if err != nil {
		return nil, &StatusError{Code: Unavailable, Message: fmt.Sprintf("dialling %s: %v", target, err), cause: err}
	}
	return &GRPCClient{ThreadwireClient: pb.NewThreadwireClient(conn), conn: conn}, nil
}

// Conn is the underlying connection (for grpc.health.v1 or reflection clients).
func (c *GRPCClient) Conn() *grpc.ClientConn { return c.conn }

// Close ends the connection.
func (c *GRPCClient) Close() error { return c.conn.Close() }

// WithIdempotencyKey makes a call on ctx carry `idempotency-key: key`: a
// retry with the same key is answered with the first attempt's result
// (docs/protocol.md, section 3).
func WithIdempotencyKey(ctx context.Context, key string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "idempotency-key", key)
}

// ImportRollout sends a codex rollout file as ThreadImportStream's pieces of
// at most linesPerPiece lines and returns the report.
func (c *GRPCClient) ImportRollout(ctx context.Context, fileName string, lines [][]byte, linesPerPiece int) (*pb.ImportReport, error) {
	if linesPerPiece <= 0 {
		return nil, &StatusError{Code: InvalidArgument, Message: "linesPerPiece must be positive"}
	}
	stream, err := c.ThreadImportStream(ctx)
	if err != nil {
		return nil, err
	}
	for start := 0; start == 0 || start < len(lines); start += linesPerPiece {
		end := start + linesPerPiece
		if end > len(lines) {
			end = len(lines)
		}
		piece := &pb.ThreadImportParams{Lines: lines[start:end]}
		if start == 0 {
			piece.FileName = proto.String(fileName)
		}
		if err := stream.Send(piece); err != nil {
			// The server ended the call: its status comes with CloseAndRecv.
			break
		}
	}
	result, err := stream.CloseAndRecv()
	if err != nil {
		return nil, err
	}
	return result.GetReport(), nil
}

type protoCodec struct{}

func (protoCodec) Marshal(v interface{}) ([]byte, error) {
	message, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("threadwire: %T is not a protobuf message", v)
	}
	return proto.Marshal(message)
}

func (protoCodec) Unmarshal(data []byte, v interface{}) error {
	message, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("threadwire: %T is not a protobuf message", v)
	}
	return proto.Unmarshal(data, message)
}

func (protoCodec) Name() string { return "proto" }

type bearerToken struct{ token string }

func (b bearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// A token over cleartext is the operator's choice (the server refuses a
// non-loopback address without TLS or auth); grpc-go would refuse it.
func (b bearerToken) RequireTransportSecurity() bool { return false }

// grpcCode is a gRPC status error's code (ok false for other errors).
func grpcCode(err error) (Code, bool) {
	var withStatus interface{ GRPCStatus() *status.Status }
	if errors.As(err, &withStatus) {
		return Code(withStatus.GRPCStatus().Code()), true
	}
	return Unknown, false
}
