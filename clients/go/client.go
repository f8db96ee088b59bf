// Package threadwire is a Go client for the threadwire session server: protobuf
// Envelopes in length-prefixed frames over TCP (docs/protocol.md).
//
// A Client is safe for concurrent use: calls from many goroutines pipeline
// on one connection and each gets its own response. Deadlines and
// cancellation come from the context.Context of each call; a deadline is also
// sent to the server as the request's timeout_ms. Failures are *StatusError
// values carrying the server's status code.
package threadwire

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/threadwire/threadwire/clients/go/threadwirepb"
	"google.golang.org/protobuf/proto"
)

// ProtocolVersion is the protocol this package speaks.
const ProtocolVersion = 1

// maxFrameBytes bounds what the client buffers for one frame from the server.
const defaultMaxFrameBytes = 64 << 20

// Handlers serve the calls a server makes to this client (item/tool/call,
// item/tool/request_approval, item/tool/request_user_input). The client
// declares the capability of each handler that is set, and the server asks
// it only for threads it is subscribed to as their principal. Each request
// runs in its own goroutine; a returned error is sent back as INTERNAL with
// its text (a tool's own failure is a ToolCallResult with IsError set).
type Handlers struct {
	Tool      func(ctx context.Context, request *pb.ServerRequest, params *pb.ToolCallParams) (*pb.ToolCallResult, error)
	Approval  func(ctx context.Context, request *pb.ServerRequest, params *pb.ApprovalParams) (*pb.ApprovalResult, error)
	UserInput func(ctx context.Context, request *pb.ServerRequest, params *pb.UserInputParams) (*pb.UserInputResult, error)
}

type options struct {
	tls           *tls.Config
	token         string
	name          string
	version       string
	optOut        []string
	handlers      Handlers
	initialize    bool
	buffer        int
	maxFrameBytes int
	dialer        net.Dialer
}

// Option configures Dial.
type Option func(*options)

// WithTLS speaks TLS with the given configuration (set ServerName when the
// address is not the certificate's name; add Certificates for mutual TLS).
func WithTLS(config *tls.Config) Option { return func(o *options) { o.tls = config } }

// WithToken sends a bearer token in initialize, for servers that authenticate.
func WithToken(token string) Option { return func(o *options) { o.token = token } }

// WithClientInfo names the client in initialize (default "threadwire-go").
func WithClientInfo(name, version string) Option {
	return func(o *options) { o.name, o.version = name, version }
}

// WithOptOut lists notification methods (e.g. "item/agent_message/delta")
// this connection never wants.
func WithOptOut(methods ...string) Option {
	return func(o *options) { o.optOut = append(o.optOut, methods...) }
}

// WithHandlers serves calls from the server to this client.
func WithHandlers(handlers Handlers) Option { return func(o *options) { o.handlers = handlers } }

// WithoutInitialize leaves the connection uninitialized (only health/check,
// reflection/descriptors and a hand-made Initialize are then served).
func WithoutInitialize() Option { return func(o *options) { o.initialize = false } }

// WithNotificationBuffer sets how many notifications wait in Notifications()
// (default 1024). When it is full the client stops reading the connection
// until the channel is drained, so responses wait too and a server that
// finds this connection too slow disconnects it: drain the channel, or opt
// out of what you do not read.
func WithNotificationBuffer(size int) Option { return func(o *options) { o.buffer = size } }

// Client is one connection to a threadwire server.
type Client struct {
	conn          net.Conn
	writeMu       sync.Mutex
	writer        *bufio.Writer
	nextID        atomic.Uint64
	mu            sync.Mutex
	pending       map[uint64]chan *pb.Response
	closedErr     error
	notifications chan *pb.Notification
	handlers      Handlers
	done          chan struct{}
	maxFrameBytes int
	info          *pb.InitializeResult
	serving       sync.WaitGroup
	serveCtx      context.Context
	stopServing   context.CancelFunc
}

// Dial connects to addr ("host:port") and, unless WithoutInitialize is
// given, initializes the connection. ctx bounds the connection and the
// handshake.
func Dial(ctx context.Context, addr string, opts ...Option) (*Client, error) {
	o := options{name: "threadwire-go", version: "0.1.0", initialize: true, buffer: 1024, maxFrameBytes: defaultMaxFrameBytes}
	for _, opt := range opts {
		opt(&o)
	}
	conn, err := o.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, &StatusError{Code: Unavailable, Message: err.Error(), cause: err}
	}
	if o.tls != nil {
		config := o.tls.Clone()
		if config.ServerName == "" {
			host, _, _ := net.SplitHostPort(addr)
			config.ServerName = host
		}
		tlsConn := tls.Client(conn, config)
		if err := tlsConn.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, &StatusError{Code: Unavailable, Message: "TLS handshake: " + err.Error(), cause: err}
		}
		conn = tlsConn
	}
	serveCtx, stop := context.WithCancel(context.Background())
	c := &Client{
		conn:          conn,
		writer:        bufio.NewWriter(conn),
		pending:       map[uint64]chan *pb.Response{},
		notifications: make(chan *pb.Notification, o.buffer),
		handlers:      o.handlers,
		done:          make(chan struct{}),
		maxFrameBytes: o.maxFrameBytes,
		serveCtx:      serveCtx,
		stopServing:   stop,
	}
	go c.readLoop()
	if !o.initialize {
		return c, nil
	}
	params := &pb.InitializeParams{
		ClientInfo:      &pb.ClientInfo{Name: proto.String(o.name), Version: proto.String(o.version)},
		ProtocolVersion: proto.Uint32(ProtocolVersion),
		Capabilities: &pb.Capabilities{
			OptOutNotificationMethods: o.optOut,
			ClientTools:               proto.Bool(o.handlers.Tool != nil),
			Approvals:                 proto.Bool(o.handlers.Approval != nil),
			UserInput:                 proto.Bool(o.handlers.UserInput != nil),
		},
	}
	if o.token != "" {
		params.AuthToken = proto.String(o.token)
	}
	info, err := c.Initialize(ctx, params)
	if err != nil {
		c.Close()
		return nil, err
	}
	c.info = info
	return c, nil
}

// ServerInfo is what initialize returned (nil without it).
func (c *Client) ServerInfo() *pb.InitializeResult { return c.info }

// Notifications delivers the notifications of subscribed threads in order.
// It is closed when the connection ends.
func (c *Client) Notifications() <-chan *pb.Notification { return c.notifications }

// Done is closed when the connection has ended; Err then says why.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err is why the connection ended (nil while it is open).
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closedErr
}

// Call sends a request and waits for its response. The id is assigned here;
// ctx's deadline becomes timeout_ms. A non-OK response is a *StatusError.
func (c *Client) Call(ctx context.Context, request *pb.Request) (*pb.Response, error) {
	response, err := c.CallRaw(ctx, request)
	if err != nil {
		return nil, err
	}
	if code := Code(response.GetCode()); code != OK {
		return nil, &StatusError{Code: code, Message: response.GetMessage()}
	}
	return response, nil
}

// CallRaw is Call without turning a non-OK response into an error.
func (c *Client) CallRaw(ctx context.Context, request *pb.Request) (*pb.Response, error) {
	return c.Go(ctx, request).Wait()
}

// Pending is a request sent by Go whose response has not been waited for.
type Pending struct {
	client *Client
	ctx    context.Context
	id     uint64
	reply  chan *pb.Response
	err    error
}

// Go sends a request without waiting for its response (pipelining):
// requests sent by successive calls to Go are written in that order, and the
// server answers a connection's requests in the order they arrive. The id is
// assigned here; ctx's deadline becomes timeout_ms and bounds Wait.
func (c *Client) Go(ctx context.Context, request *pb.Request) *Pending {
	if err := ctx.Err(); err != nil {
		return &Pending{err: contextError(err)}
	}
	request = proto.Clone(request).(*pb.Request)
	id := c.nextID.Add(1)
	request.Id = proto.Uint64(id)
	if deadline, ok := ctx.Deadline(); ok {
		remaining := time.Until(deadline).Milliseconds()
		if remaining < 1 {
			return &Pending{err: contextError(context.DeadlineExceeded)}
		}
		if remaining > int64(^uint32(0)) {
			remaining = int64(^uint32(0))
		}
		request.TimeoutMs = proto.Uint32(uint32(remaining))
	}
	pending := &Pending{client: c, ctx: ctx, id: id, reply: make(chan *pb.Response, 1)}
	c.mu.Lock()
	if c.closedErr != nil {
		pending.err = c.closedErr
		c.mu.Unlock()
		return pending
	}
	c.pending[id] = pending.reply
	c.mu.Unlock()
	if err := c.send(&pb.Envelope{Kind: &pb.Envelope_Request{Request: request}}); err != nil {
		pending.forget()
		pending.err = err
	}
	return pending
}

// Wait returns the response (any status code), or a *StatusError for a lost
// connection, a passed deadline or a cancelled context.
func (p *Pending) Wait() (*pb.Response, error) {
	if p.err != nil {
		return nil, p.err
	}
	select {
	case response, ok := <-p.reply:
		if !ok {
			return nil, p.client.Err()
		}
		return response, nil
	case <-p.ctx.Done():
		// The response, when it comes, is dropped.
		p.forget()
		return nil, contextError(p.ctx.Err())
	}
}

func (p *Pending) forget() {
	p.client.mu.Lock()
	delete(p.client.pending, p.id)
	p.client.mu.Unlock()
}

// Close ends the connection; waiting calls fail with UNAVAILABLE.
func (c *Client) Close() error {
	err := c.conn.Close()
	<-c.done
	c.stopServing()
	c.serving.Wait()
	return err
}

func (c *Client) send(envelope *pb.Envelope) error {
	payload, err := proto.Marshal(envelope)
	if err != nil {
		return &StatusError{Code: InvalidArgument, Message: "cannot encode the request: " + err.Error(), cause: err}
	}
	var header [5]byte
	binary.BigEndian.PutUint32(header[1:], uint32(len(payload)))
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if _, err := c.writer.Write(header[:]); err == nil {
		_, err = c.writer.Write(payload)
	}
	if err == nil {
		err = c.writer.Flush()
	}
	if err != nil {
		return &StatusError{Code: Unavailable, Message: "connection lost: " + err.Error(), cause: err}
	}
	return nil
}

func (c *Client) readLoop() {
	reader := bufio.NewReaderSize(c.conn, 64<<10)
	err := c.read(reader)
	c.mu.Lock()
	if errors.Is(err, io.EOF) {
		c.closedErr = &StatusError{Code: Unavailable, Message: "the server closed the connection"}
	} else if errors.Is(err, net.ErrClosed) {
		c.closedErr = &StatusError{Code: Unavailable, Message: "the connection was closed"}
	} else {
		var status *StatusError
		if !errors.As(err, &status) {
			status = &StatusError{Code: Unavailable, Message: "connection lost: " + err.Error(), cause: err}
		}
		c.closedErr = status
	}
	for id, reply := range c.pending {
		close(reply)
		delete(c.pending, id)
	}
	c.mu.Unlock()
	c.conn.Close()
	close(c.notifications)
	close(c.done)
}

func (c *Client) read(reader *bufio.Reader) error {
	var header [5]byte
	for {
		if _, err := io.ReadFull(reader, header[:]); err != nil {
			return err
		}
		if header[0] != 0 {
			return &StatusError{Code: Internal, Message: fmt.Sprintf("the server sent a frame with flags 0x%02x", header[0])}
		}
		length := binary.BigEndian.Uint32(header[1:])
		if int64(length) > int64(c.maxFrameBytes) {
			return &StatusError{Code: ResourceExhausted, Message: fmt.Sprintf("the server sent a %d-byte frame, over this client's %d", length, c.maxFrameBytes)}
		}
		payload := make([]byte, length)
		if _, err := io.ReadFull(reader, payload); err != nil {
			return err
		}
		envelope := &pb.Envelope{}
		if err := proto.Unmarshal(payload, envelope); err != nil {
			return &StatusError{Code: Internal, Message: "undecodable frame from the server: " + err.Error(), cause: err}
		}
		switch kind := envelope.Kind.(type) {
		case *pb.Envelope_Response:
			c.mu.Lock()
			reply, ok := c.pending[kind.Response.GetId()]
			delete(c.pending, kind.Response.GetId())
			c.mu.Unlock()
			if ok {
				reply <- kind.Response
			}
		case *pb.Envelope_Notification:
			c.notifications <- kind.Notification
		case *pb.Envelope_ServerRequest:
			c.serving.Add(1)
			go c.serve(kind.ServerRequest)
		}
	}
}

// serve answers one server request with the registered handler.
func (c *Client) serve(request *pb.ServerRequest) {
	defer c.serving.Done()
	ctx := c.serveCtx
	if request.GetTimeoutMs() > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(request.GetTimeoutMs())*time.Millisecond)
		defer cancel()
	}
	answer := &pb.ServerRequestAnswer{Id: request.Id}
	var err error
	unhandled := false
	switch params := request.Params.(type) {
	case *pb.ServerRequest_ItemToolCall:
		if c.handlers.Tool == nil {
			unhandled = true
			break
		}
		var result *pb.ToolCallResult
		if result, err = c.handlers.Tool(ctx, request, params.ItemToolCall); err == nil {
			answer.Result = &pb.ServerRequestAnswer_ItemToolCall{ItemToolCall: result}
		}
	case *pb.ServerRequest_ItemToolRequestApproval:
		if c.handlers.Approval == nil {
			unhandled = true
			break
		}
		var result *pb.ApprovalResult
		if result, err = c.handlers.Approval(ctx, request, params.ItemToolRequestApproval); err == nil {
			answer.Result = &pb.ServerRequestAnswer_ItemToolRequestApproval{ItemToolRequestApproval: result}
		}
	case *pb.ServerRequest_ItemToolRequestUserInput:
		if c.handlers.UserInput == nil {
			unhandled = true
			break
		}
		var result *pb.UserInputResult
		if result, err = c.handlers.UserInput(ctx, request, params.ItemToolRequestUserInput); err == nil {
			answer.Result = &pb.ServerRequestAnswer_ItemToolRequestUserInput{ItemToolRequestUserInput: result}
		}
	default:
		unhandled = true
	}
	switch {
	case unhandled:
		answer.Code = proto.Uint32(uint32(Unimplemented))
		answer.Message = proto.String(fmt.Sprintf("this client has no handler for %s", ServerRequestMethod(request)))
	case err != nil:
		answer.Code = proto.Uint32(uint32(Internal))
		answer.Message = proto.String(err.Error())
	case answer.Result == nil:
		answer.Code = proto.Uint32(uint32(Internal))
		answer.Message = proto.String("the handler returned no result")
	default:
		answer.Code = proto.Uint32(uint32(OK))
	}
	// A lost connection is reported by Done/Err; nothing to answer then.
	_ = c.send(&pb.Envelope{Kind: &pb.Envelope_ServerRequestAnswer{ServerRequestAnswer: answer}})
}
