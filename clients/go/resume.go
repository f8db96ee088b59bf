package threadwire

import (
	"context"
	"errors"
	"sort"
	"time"

	pb "github.com/threadwire/threadwire/clients/go/threadwirepb"
	"google.golang.org/protobuf/proto"
)

// ResumingSubscription subscribes to threads over a connection dialled
// again whenever one ends (a restart, a failover, a proxy cutting it, the
// server cutting a reader that fell behind), each time resuming every
// thread after the last numbered event it handed on (thread/resume with
// after_thread_sequence). The handler gets each kept event once, in
// order; notifications that are not kept (deltas) pass through as they
// come; thread/closed is left out, since the subscription goes on. Child
// agents a subscribed root spawns are resumed too, each after its own
// number, and those spawned while the connection was down from their first
// event (found with thread/list by parent after each resume).
type ResumingSubscription struct {
	Threads []string
	// Dial opens and initializes a connection (with the handlers the
	// application serves); it may pick another instance each time.
	Dial func(ctx context.Context) (*Client, error)
	// Backoff between failed connections (MaxAttempts is not used: it
	// dials for as long as it runs).
	Policy RetryPolicy
	// OnGap is called when a thread's next event is no longer kept: the
	// application re-reads the thread; the subscription goes on from its
	// newest event.
	OnGap func(threadID, message string)
}

// Run hands notifications to handle until ctx is done. after gives the
// positions to start from (a thread not in it starts from its newest event).
func (s *ResumingSubscription) Run(ctx context.Context, after map[string]uint64, handle func(*pb.Notification)) error {
	policy := s.Policy
	if policy.InitialBackoff <= 0 || policy.Multiplier <= 0 {
		policy = DefaultRetryPolicy()
	}
	last := map[string]uint64{}
	for id, n := range after {
		last[id] = n
	}
	attempt := 1
	for ctx.Err() == nil {
		if attempt > 1 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(policy.pause(attempt)):
			}
		}
		if attempt < 32 {
			attempt++
		}
		client, err := s.Dial(ctx)
		if err != nil {
			continue
		}
		if s.resumeAll(ctx, client, last) != nil {
			client.Close()
			continue
		}
		attempt = 1
	read:
		for {
			select {
			case <-ctx.Done():
				client.Close()
				return ctx.Err()
			case note, open := <-client.Notifications():
				if !open {
					break read
				}
				if note.GetThreadClosed() != nil {
					continue
				}
				if id := NotificationThreadID(note); note.ThreadSequence != nil && id != "" {
					if note.GetThreadSequence() <= last[id] {
						continue // heard before the cut
					}
					last[id] = note.GetThreadSequence()
				}
				handle(note)
			}
		}
		client.Close()
	}
	return ctx.Err()
}

func (s *ResumingSubscription) resumeAll(ctx context.Context, client *Client, last map[string]uint64) error {
	ids := append([]string{}, s.Threads...)
	var heard []string
	for id := range last {
		if !contains(s.Threads, id) {
			heard = append(heard, id)
		}
	}
	sort.Strings(heard)
	for _, id := range append(ids, heard...) {
		if err := s.resume(ctx, client, id, last); err != nil {
			return err
		}
	}
	return nil
}

// resume resumes id, then its child agents not heard of yet: from their
// first event when id resumed from a position (they were spawned while the
// subscription was away), else from their newest.
func (s *ResumingSubscription) resume(ctx context.Context, client *Client, id string, last map[string]uint64) error {
	_, following := last[id]
	if err := s.resumeOne(ctx, client, id, last); err != nil {
		return err
	}
	var cursor *string
	for {
		page, err := client.ThreadList(ctx, &pb.ThreadListParams{ParentThreadId: proto.String(id), Limit: proto.Uint32(100), Cursor: cursor})
		if err != nil {
			return err
		}
		for _, child := range page.GetData() {
			if _, known := last[child.GetId()]; known {
				continue
			}
			if following {
				last[child.GetId()] = 0
			}
			if err := s.resume(ctx, client, child.GetId(), last); err != nil {
				return err
			}
		}
		if page.GetNextCursor() == "" {
			return nil
		}
		cursor = proto.String(page.GetNextCursor())
	}
}

func (s *ResumingSubscription) resumeOne(ctx context.Context, client *Client, id string, last map[string]uint64) error {
	params := &pb.ThreadResumeParams{ThreadId: proto.String(id), ExcludeTurns: proto.Bool(true)}
	position, known := last[id]
	if known {
		params.AfterThreadSequence = proto.Uint64(position)
	}
	result, err := client.ThreadResume(ctx, params)
	var status *StatusError
	if errors.As(err, &status) && status.Code == OutOfRange {
		if s.OnGap != nil {
			s.OnGap(id, status.Message)
		}
		delete(last, id)
		return s.resumeOne(ctx, client, id, last)
	}
	if err != nil {
		return err
	}
	if !known {
		last[id] = result.GetThread().GetThreadSequence()
	}
	return nil
}

func contains(list []string, value string) bool {
	for _, item := range list {
		if item == value {
			return true
		}
	}
	return false
}

// NotificationThreadID is the thread a notification is about ("" for none).
func NotificationThreadID(note *pb.Notification) string {
	if started := note.GetThreadStarted(); started != nil {
		return started.GetThread().GetId()
	}
	message := note.ProtoReflect()
	field := message.WhichOneof(message.Descriptor().Oneofs().ByName("payload"))
	if field == nil {
		return ""
	}
	if payload, ok := message.Get(field).Message().Interface().(interface{ GetThreadId() string }); ok {
		return payload.GetThreadId()
	}
	return ""
}
