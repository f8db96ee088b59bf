package threadwire

import (
	"context"
	"crypto/rand"
	"fmt"
	"math"
	mathrand "math/rand"
	"sync"
	"time"

	pb "github.com/threadwire/threadwire/clients/go/threadwirepb"
	"google.golang.org/protobuf/proto"
)

// RetryPolicy is gRPC's retry policy: up to MaxAttempts in all after
// UNAVAILABLE or a lost connection, with exponential backoff and full jitter.
type RetryPolicy struct {
	MaxAttempts    int
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	Multiplier     float64
	// Retried status codes (UNAVAILABLE).
	RetryableCodes []Code
}

// DefaultRetryPolicy: 5 attempts, 100 ms doubling to at most 5 s.
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{MaxAttempts: 5, InitialBackoff: 100 * time.Millisecond, MaxBackoff: 5 * time.Second, Multiplier: 2,
		RetryableCodes: []Code{Unavailable}}
}

func (p RetryPolicy) retryable(code Code) bool {
	for _, c := range p.RetryableCodes {
		if c == code {
			return true
		}
	}
	return false
}

// pause before attempt (2, 3, ...): random up to the backoff.
func (p RetryPolicy) pause(attempt int) time.Duration {
	ceiling := float64(p.InitialBackoff) * math.Pow(p.Multiplier, float64(attempt-2))
	if ceiling > float64(p.MaxBackoff) {
		ceiling = float64(p.MaxBackoff)
	}
	if ceiling < 1 {
		return 0
	}
	return time.Duration(mathrand.Int63n(int64(ceiling) + 1))
}

// Mutates reports whether a request changes state (reflection/descriptors
// says the same per method): such a request is retried only with an
// idempotency key.
func Mutates(request *pb.Request) bool {
	switch request.GetParams().(type) {
	case *pb.Request_ThreadStart, *pb.Request_ThreadResume, *pb.Request_ThreadFork, *pb.Request_ThreadArchive,
		*pb.Request_ThreadUnarchive, *pb.Request_ThreadUnsubscribe, *pb.Request_ThreadSettingsUpdate, *pb.Request_AgentSpawn,
		*pb.Request_ThreadToolsUpdate, *pb.Request_ThreadCompactStart, *pb.Request_ThreadRollback, *pb.Request_ThreadRevert, *pb.Request_ThreadNameSet, *pb.Request_ThreadQueueUpdate, *pb.Request_ThreadQueueDelete, *pb.Request_ThreadQueueReorder, *pb.Request_ThreadDelete,
		*pb.Request_TurnStart, *pb.Request_TurnInterrupt, *pb.Request_TurnSteer, *pb.Request_TurnContinue, *pb.Request_ThreadImport:
		return true
	}
	return false
}

// NewIdempotencyKey is a random UUID (version 4).
func NewIdempotencyKey() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// ReconnectingClient sends calls on a connection that dial opens (again
// after one is lost; dial may pick another instance each time) and retries
// them under a RetryPolicy. A mutation carries one idempotency key on every
// attempt, so the server applies it once however many attempts reach it.
// Subscriptions belong to a connection: after a reconnect (Connections
// grew), resume the threads to hear of them again. Safe for concurrent use.
type ReconnectingClient struct {
	dial        func(ctx context.Context) (*Client, error)
	policy      RetryPolicy
	mu          sync.Mutex
	current     *Client
	connections int
}

// NewReconnectingClient: calls go through connections dial opens.
func NewReconnectingClient(dial func(ctx context.Context) (*Client, error), policy RetryPolicy) *ReconnectingClient {
	if policy.MaxAttempts < 1 {
		policy.MaxAttempts = 1
	}
	return &ReconnectingClient{dial: dial, policy: policy}
}

// Connections is how many connections were opened so far.
func (r *ReconnectingClient) Connections() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.connections
}

// Client is the connection calls go out on now, opened if there is none.
func (r *ReconnectingClient) Client(ctx context.Context) (*Client, error) {
	r.mu.Lock()
	if r.current != nil {
		select {
		case <-r.current.Done():
			r.current = nil
		default:
			current := r.current
			r.mu.Unlock()
			return current, nil
		}
	}
	r.mu.Unlock()
	fresh, err := r.dial(ctx)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.current != nil {
		r.current.Close()
	}
	r.current = fresh
	r.connections++
	return fresh, nil
}

func (r *ReconnectingClient) drop(lost *Client) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.current == lost {
		r.current = nil
	}
	go lost.Close()
}

// CallRaw sends the request under the policy and returns the last response
// (any status); an error only when no attempt got an answer. A mutation
// without IdempotencyKey gets a new one, the same on every attempt.
func (r *ReconnectingClient) CallRaw(ctx context.Context, request *pb.Request) (*pb.Response, error) {
	if request.IdempotencyKey == nil && Mutates(request) {
		request = proto.Clone(request).(*pb.Request)
		request.IdempotencyKey = proto.String(NewIdempotencyKey())
	}
	for attempt := 1; ; attempt++ {
		client, err := r.Client(ctx)
		var response *pb.Response
		if err == nil {
			response, err = client.CallRaw(ctx, request)
			if err != nil && CodeOf(err) == Unavailable {
				r.drop(client) // the connection broke: the outcome is unknown, the key makes a retry safe
			}
		}
		switch {
		case err == nil && (!r.policy.retryable(Code(response.GetCode())) || attempt >= r.policy.MaxAttempts):
			return response, nil
		case err != nil && (CodeOf(err) != Unavailable || attempt >= r.policy.MaxAttempts || ctx.Err() != nil):
			return nil, err
		}
		select {
		case <-time.After(r.policy.pause(attempt + 1)):
		case <-ctx.Done():
			return nil, contextError(ctx.Err())
		}
	}
}

// Call is CallRaw with a non-OK response as a *StatusError.
func (r *ReconnectingClient) Call(ctx context.Context, request *pb.Request) (*pb.Response, error) {
	response, err := r.CallRaw(ctx, request)
	if err != nil {
		return nil, err
	}
	if code := Code(response.GetCode()); code != OK {
		return nil, &StatusError{Code: code, Message: response.GetMessage()}
	}
	return response, nil
}

// Close closes the current connection.
func (r *ReconnectingClient) Close() error {
	r.mu.Lock()
	current := r.current
	r.current = nil
	r.mu.Unlock()
	if current == nil {
		return nil
	}
	return current.Close()
}
