package threadwire

import (
	"bytes"
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"

	pb "github.com/threadwire/threadwire/clients/go/threadwirepb"
	"google.golang.org/protobuf/proto"
)

func dialGRPC(t *testing.T, addr string, opts ...GRPCOption) *GRPCClient {
	t.Helper()
	client, err := DialGRPC(testContext(t), addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

// The generated stubs over TLS with tokens: a thread started, a turn run and
// heard on Subscribe, read back; the statuses of a missing token, an unknown
// thread and another principal's thread; an idempotency key applied once.
func TestGRPCStubsStartSubscribeTurnAndRead(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("alice alice-token-0123456789abcdef\nbob bob-token-0123456789abcdef0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := startGRPCServer(t, "--tls-cert", certFile, "--tls-key", keyFile, "--auth-tokens", tokens)
	ctx := testContext(t)
	secure := GRPCWithTLS(&tls.Config{RootCAs: pool, ServerName: "localhost"})

	anonymous := dialGRPC(t, addr, secure)
	if _, err := anonymous.ThreadStart(ctx, &pb.ThreadStartParams{}); CodeOf(err) != Unauthenticated {
		t.Fatalf("no token: want UNAUTHENTICATED, got %v", err)
	}

	alice := dialGRPC(t, addr, secure, GRPCWithToken("alice-token-0123456789abcdef"))
	started, err := alice.ThreadStart(ctx, &pb.ThreadStartParams{MultiAgentMode: pb.MultiAgentMode_MULTI_AGENT_MODE_PROACTIVE.Enum()})
	if err != nil {
		t.Fatal(err)
	}
	threadID := started.GetThread().GetId()
	if started.GetMultiAgentMode() != pb.MultiAgentMode_MULTI_AGENT_MODE_PROACTIVE {
		t.Fatalf("selected mode %v", started.GetMultiAgentMode())
	}

	subscription, err := alice.Subscribe(ctx, &pb.ThreadSubscribeParams{ThreadId: proto.String(threadID), AfterThreadSequence: proto.Uint64(0)})
	if err != nil {
		t.Fatal(err)
	}
	turn, err := alice.TurnStart(ctx, &pb.TurnStartParams{ThreadId: proto.String(threadID),
		Input: []*pb.UserInput{{Content: &pb.UserInput_Text{Text: "hello over gRPC"}}}})
	if err != nil {
		t.Fatal(err)
	}
	var heard []string
	var last uint64
	for {
		note, err := subscription.Recv()
		if err != nil {
			t.Fatalf("the subscription ended after %v: %v", heard, err)
		}
		method := NotificationMethod(note)
		heard = append(heard, method)
		if note.ThreadSequence == nil {
			if method != "item/agent_message/delta" && method != "thread/token_usage/updated" {
				t.Fatalf("%s carries no thread_sequence", method)
			}
			continue
		}
		if note.GetThreadSequence() != last+1 {
			t.Fatalf("thread_sequence %d after %d", note.GetThreadSequence(), last)
		}
		last = note.GetThreadSequence()
		if note.GetTurnCompleted().GetTurn().GetId() == turn.GetTurn().GetId() {
			break
		}
	}
	if heard[0] != "thread/started" || !strings.Contains(strings.Join(heard, " "), "turn/started") {
		t.Fatalf("heard %v: want thread/started first (kept from 0), then the turn", heard)
	}

	read, err := alice.ThreadRead(ctx, &pb.ThreadReadParams{ThreadId: proto.String(threadID), IncludeTurns: proto.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	if turns := read.GetThread().GetTurns(); len(turns) != 1 || turns[0].GetStatus() != pb.TurnStatus_TURN_STATUS_COMPLETED {
		t.Fatalf("read back %v", read.GetThread().GetTurns())
	}
	if _, err := alice.ThreadRead(ctx, &pb.ThreadReadParams{ThreadId: proto.String("no-such-thread")}); CodeOf(err) != NotFound {
		t.Fatalf("unknown thread: want NOT_FOUND, got %v", err)
	}
	bob := dialGRPC(t, addr, secure, GRPCWithToken("bob-token-0123456789abcdef0"))
	if _, err := bob.ThreadRead(ctx, &pb.ThreadReadParams{ThreadId: proto.String(threadID)}); CodeOf(err) != NotFound {
		t.Fatalf("another principal's thread: want NOT_FOUND, got %v", err)
	}

	keyed := WithIdempotencyKey(ctx, "go-grpc-start-1")
	first, err := alice.ThreadStart(keyed, &pb.ThreadStartParams{})
	if err != nil {
		t.Fatal(err)
	}
	again, err := alice.ThreadStart(keyed, &pb.ThreadStartParams{})
	if err != nil {
		t.Fatal(err)
	}
	if first.GetThread().GetId() != again.GetThread().GetId() {
		t.Fatalf("a retried start with one idempotency key made two threads: %s, %s", first.GetThread().GetId(), again.GetThread().GetId())
	}
}

// ThreadImportStream: a rollout sent a few lines per message is imported as
// the same file sent whole, and a message that numbers itself is refused.
func TestGRPCImportStreamImportsARolloutInPieces(t *testing.T) {
	addr := startGRPCServer(t)
	client := dialGRPC(t, addr)
	ctx := testContext(t)
	content, err := os.ReadFile("../../integration/rollouts/root.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimRight(content, "\n"), []byte("\n"))
	if len(lines) < 3 {
		t.Fatalf("the fixture has %d lines", len(lines))
	}
	report, err := client.ImportRollout(ctx, "root.jsonl", lines, 2)
	if err != nil {
		t.Fatal(err)
	}
	if report.GetOutcome() != pb.ImportOutcome_IMPORT_OUTCOME_IMPORTED || report.GetLines() != uint64(len(lines)) || report.GetFileName() != "root.jsonl" {
		t.Fatalf("report %v for %d lines", report, len(lines))
	}
	whole, err := client.ThreadImport(ctx, &pb.ThreadImportParams{FileName: proto.String("root.jsonl"), Lines: lines})
	if err != nil {
		t.Fatal(err)
	}
	if whole.GetReport().GetOutcome() != pb.ImportOutcome_IMPORT_OUTCOME_UNCHANGED || whole.GetReport().GetThreadId() != report.GetThreadId() {
		t.Fatalf("the whole file after the pieces: %v (pieces made %s)", whole.GetReport(), report.GetThreadId())
	}
	read, err := client.ThreadRead(ctx, &pb.ThreadReadParams{ThreadId: proto.String(report.GetThreadId())})
	if err != nil {
		t.Fatal(err)
	}
	if read.GetThread().GetId() != report.GetThreadId() {
		t.Fatalf("read %v", read.GetThread())
	}

	stream, err := client.ThreadImportStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.ThreadImportParams{Lines: lines[:1], FirstLine: proto.Uint64(5)}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.CloseAndRecv(); CodeOf(err) != InvalidArgument || !strings.Contains(err.Error(), "first_line") {
		t.Fatalf("a piece that numbers itself: want INVALID_ARGUMENT naming first_line, got %v", err)
	}
}
