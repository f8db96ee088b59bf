package threadwire

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	pb "github.com/threadwire/threadwire/clients/go/threadwirepb"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// serverBinary is the server these tests run: THREADWIRE_SERVER_BIN, else
// the repository's debug build; its absence fails the test saying how to
// get one.
func serverBinary(t *testing.T) string {
	t.Helper()
	binary := os.Getenv("THREADWIRE_SERVER_BIN")
	if binary == "" {
		binary = "../../.build/debug/threadwire-server"
	}
	if _, err := os.Stat(binary); err != nil {
		t.Fatalf("no threadwire-server at %s: run `swift build` at the repository root (or `make test-go`), "+
			"or set THREADWIRE_SERVER_BIN to a built server", binary)
	}
	return binary
}

// startServer runs the real server binary (THREADWIRE_SERVER_BIN, default
// the debug build) on a fresh store and returns its address.
func startServer(t *testing.T, arguments ...string) string {
	t.Helper()
	binary := serverBinary(t)
	dir := t.TempDir()
	config := filepath.Join(dir, "config.json")
	if err := os.WriteFile(config, []byte(`{"features": {"multi_agent_v2": true, "multi_agent_mode": true}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	command := exec.Command(binary, append([]string{"--listen", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "store"),
		"--config", config, "--log-level", "error"}, arguments...)...)
	stdout, err := command.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	command.Stderr = os.Stderr
	if err := command.Start(); err != nil {
		t.Fatalf("starting %s: %v", binary, err)
	}
	t.Cleanup(func() {
		command.Process.Signal(os.Interrupt)
		command.Wait()
	})
	output := bufio.NewReader(stdout)
	line, err := output.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "threadwire listening on ") {
		t.Fatalf("server did not start: %q %v", line, err)
	}
	serverOutput = output
	return strings.TrimSpace(strings.TrimPrefix(line, "threadwire listening on "))
}

// serverOutput is the standard output of the server startServer started
// last, past its first line (tests that start servers do not run in parallel).
var serverOutput *bufio.Reader

// startGRPCServer starts the real server with a gRPC listener too and
// returns the listener's address.
func startGRPCServer(t *testing.T, arguments ...string) string {
	t.Helper()
	startServer(t, append([]string{"--grpc-listen", "127.0.0.1:0"}, arguments...)...)
	for {
		line, err := serverOutput.ReadString('\n')
		if err != nil {
			t.Fatalf("the server printed no gRPC address: %v", err)
		}
		if strings.HasPrefix(line, "threadwire grpc on ") {
			return strings.TrimSpace(strings.TrimPrefix(line, "threadwire grpc on "))
		}
	}
}

// restartableServer: a fixed free address and a function that starts the
// real server on it, on one store each time (a restart keeps the threads),
// with extra environment entries.
func restartableServer(t *testing.T, arguments ...string) (string, func(environment ...string) *exec.Cmd) {
	t.Helper()
	binary := serverBinary(t)
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := listener.Addr().String()
	listener.Close()
	dir := t.TempDir()
	return addr, func(environment ...string) *exec.Cmd {
		command := exec.Command(binary, append([]string{"--listen", addr, "--data-dir", filepath.Join(dir, "store"), "--log-level", "error"}, arguments...)...)
		command.Env = append(os.Environ(), environment...)
		stdout, err := command.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := command.Start(); err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || !strings.HasPrefix(line, "threadwire listening on ") {
			t.Fatalf("server did not start: %q %v", line, err)
		}
		return command
	}
}

func dial(t *testing.T, addr string, opts ...Option) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := Dial(ctx, addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitFor reads notifications until one satisfies match.
func waitFor(t *testing.T, client *Client, match func(*pb.Notification) bool) []*pb.Notification {
	t.Helper()
	var seen []*pb.Notification
	timeout := time.After(20 * time.Second)
	for {
		select {
		case note, ok := <-client.Notifications():
			if !ok {
				t.Fatalf("connection ended: %v", client.Err())
			}
			seen = append(seen, note)
			if match(note) {
				return seen
			}
		case <-timeout:
			t.Fatalf("no matching notification; saw %d", len(seen))
		}
	}
}

func TestSessionModesAndNotifications(t *testing.T) {
	addr := startServer(t)
	client := dial(t, addr, WithClientInfo("go-test", "1.0"))
	ctx := testContext(t)
	if client.ServerInfo().GetProtocolVersion() != ProtocolVersion {
		t.Fatalf("protocol %d", client.ServerInfo().GetProtocolVersion())
	}
	started, err := client.ThreadStart(ctx, &pb.ThreadStartParams{MultiAgentMode: pb.MultiAgentMode_MULTI_AGENT_MODE_PROACTIVE.Enum()})
	if err != nil {
		t.Fatal(err)
	}
	threadID := started.GetThread().GetId()
	if started.GetMultiAgentMode() != pb.MultiAgentMode_MULTI_AGENT_MODE_PROACTIVE {
		t.Fatalf("selected mode %v", started.GetMultiAgentMode())
	}
	turn, err := client.TurnStart(ctx, &pb.TurnStartParams{ThreadId: proto.String(threadID), Input: []*pb.UserInput{{Content: &pb.UserInput_Text{Text: "hello from Go"}}}})
	if err != nil {
		t.Fatal(err)
	}
	seen := waitFor(t, client, func(n *pb.Notification) bool {
		return n.GetTurnCompleted().GetTurn().GetId() == turn.GetTurn().GetId()
	})
	methods := map[string]bool{}
	var last uint64
	for _, note := range seen {
		methods[NotificationMethod(note)] = true
		if note.GetSequence() <= last {
			t.Fatalf("sequence %d after %d", note.GetSequence(), last)
		}
		last = note.GetSequence()
	}
	for _, method := range []string{"turn/started", "item/completed", "turn/completed"} {
		if !methods[method] {
			t.Errorf("no %s among %v", method, methods)
		}
	}
	if status := seen[len(seen)-1].GetTurnCompleted().GetTurn().GetStatus(); status != pb.TurnStatus_TURN_STATUS_COMPLETED {
		t.Fatalf("turn ended %v", status)
	}
	updated, err := client.ThreadSettingsUpdate(ctx, &pb.ThreadSettingsUpdateParams{ThreadId: proto.String(threadID),
		MultiAgentModeUpdate: &pb.ThreadSettingsUpdateParams_ClearMultiAgentMode{ClearMultiAgentMode: true}})
	if err != nil {
		t.Fatal(err)
	}
	if updated.GetSettings().MultiAgentMode != nil || !updated.GetChanged() {
		t.Fatalf("clear did not clear: %v", updated)
	}
}

func TestErrorsCarryStatusCodes(t *testing.T) {
	addr := startServer(t)
	client := dial(t, addr)
	ctx := testContext(t)
	_, err := client.ThreadRead(ctx, &pb.ThreadReadParams{ThreadId: proto.String("no-such-thread")})
	var status *StatusError
	if !errors.As(err, &status) || status.Code != NotFound || !strings.Contains(status.Message, "no-such-thread") {
		t.Fatalf("want NOT_FOUND naming the thread, got %v", err)
	}
	if CodeOf(err) != NotFound || CodeOf(nil) != OK {
		t.Fatal("CodeOf")
	}
	_, err = client.TurnStart(ctx, &pb.TurnStartParams{})
	if CodeOf(err) != InvalidArgument {
		t.Fatalf("want INVALID_ARGUMENT, got %v", err)
	}
	// The connection is still good.
	if _, err := client.HealthCheck(ctx, nil); err != nil {
		t.Fatal(err)
	}
}

func TestDeadlinesAndCancellation(t *testing.T) {
	addr := startServer(t)
	client := dial(t, addr)
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	_, err := client.HealthCheck(expired, nil)
	if CodeOf(err) != DeadlineExceeded || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want DEADLINE_EXCEEDED wrapping the context's, got %v", err)
	}
	cancelled, cancelNow := context.WithCancel(context.Background())
	cancelNow()
	if _, err := client.HealthCheck(cancelled, nil); CodeOf(err) != Cancelled || !errors.Is(err, context.Canceled) {
		t.Fatalf("want CANCELLED, got %v", err)
	}
	// A deadline in the future reaches the server as timeout_ms and the call succeeds.
	ctx, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if _, err := client.ThreadStart(ctx, nil); err != nil {
		t.Fatal(err)
	}
}

func TestConcurrentGoroutinesPipelineOnOneConnection(t *testing.T) {
	addr := startServer(t)
	client := dial(t, addr)
	ctx := testContext(t)
	started, err := client.ThreadStart(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	threadID := started.GetThread().GetId()
	const calls = 1000
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for i := 0; i < calls; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if i%2 == 0 {
				read, err := client.ThreadRead(ctx, &pb.ThreadReadParams{ThreadId: proto.String(threadID)})
				if err == nil && read.GetThread().GetId() != threadID {
					err = errors.New("a response for another request")
				}
				errs <- err
				return
			}
			_, err := client.HealthCheck(ctx, nil)
			errs <- err
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestServerRequestsReachHandlers(t *testing.T) {
	addr := startServer(t)
	var calls sync.Map
	client := dial(t, addr, WithHandlers(Handlers{
		Tool: func(ctx context.Context, request *pb.ServerRequest, params *pb.ToolCallParams) (*pb.ToolCallResult, error) {
			calls.Store(params.GetTool(), params.GetArguments())
			return &pb.ToolCallResult{Output: proto.String("4 files")}, nil
		},
	}))
	ctx := testContext(t)
	schema := `{"type": "object", "properties": {"dir": {"type": "string"}}, "required": ["dir"]}`
	started, err := client.ThreadStart(ctx, &pb.ThreadStartParams{ClientTools: []*pb.ToolSpec{{
		Name: proto.String("count_files"), Description: proto.String("Counts files"), ParametersJsonSchema: proto.String(schema)}}})
	if err != nil {
		t.Fatal(err)
	}
	threadID := started.GetThread().GetId()
	if _, err := client.TurnStart(ctx, &pb.TurnStartParams{ThreadId: proto.String(threadID),
		Input: []*pb.UserInput{{Content: &pb.UserInput_Text{Text: "#tool count_files {\"dir\": \"src\"}"}}}}); err != nil {
		t.Fatal(err)
	}
	seen := waitFor(t, client, func(n *pb.Notification) bool { return n.GetTurnCompleted() != nil })
	if status := seen[len(seen)-1].GetTurnCompleted().GetTurn().GetStatus(); status != pb.TurnStatus_TURN_STATUS_COMPLETED {
		t.Fatalf("turn ended %v", status)
	}
	arguments, ok := calls.Load("count_files")
	if !ok || !strings.Contains(arguments.(string), `"src"`) {
		t.Fatalf("the tool handler was not called with the model's arguments: %v", arguments)
	}
	read, err := client.ThreadRead(ctx, &pb.ThreadReadParams{ThreadId: proto.String(threadID), IncludeTurns: proto.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, item := range read.GetThread().GetTurns()[0].GetItems() {
		if item.GetToolName() == "count_files" && item.GetToolOutput() == "4 files" {
			found = true
		}
	}
	if !found {
		t.Fatal("the tool's output is not in the turn")
	}
}

func TestTLSAndTokens(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("alice alice-token-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := startServer(t, "--tls-cert", certFile, "--tls-key", keyFile, "--auth-tokens", tokens)
	ctx := testContext(t)
	config := &tls.Config{RootCAs: pool, ServerName: "localhost"}
	if _, err := Dial(ctx, addr, WithTLS(config)); CodeOf(err) != Unauthenticated {
		t.Fatalf("no token: want UNAUTHENTICATED, got %v", err)
	}
	// The handshake's own verdict, not any failed connect (also UNAVAILABLE).
	_, err := Dial(ctx, addr, WithTLS(&tls.Config{ServerName: "localhost"}), WithToken("alice-token-0123456789abcdef"))
	var unknownAuthority x509.UnknownAuthorityError
	if CodeOf(err) != Unavailable || !errors.As(err, &unknownAuthority) {
		t.Fatalf("an unverified certificate must fail the handshake as signed by an unknown authority, got %v", err)
	}
	client := dial(t, addr, WithTLS(config), WithToken("alice-token-0123456789abcdef"))
	started, err := client.ThreadStart(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if started.GetThread().GetId() == "" {
		t.Fatal("no thread id")
	}
}

func TestReflectionBeforeInitialize(t *testing.T) {
	addr := startServer(t)
	client := dial(t, addr, WithoutInitialize())
	ctx := testContext(t)
	schema, err := client.ReflectionDescriptors(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if schema.GetEnvelopeType() != "threadwire.v1.Envelope" || len(schema.GetFileDescriptorSet()) == 0 {
		t.Fatalf("schema %v", schema.GetEnvelopeType())
	}
	names := map[string]bool{}
	for _, method := range schema.GetMethods() {
		names[method.GetName()] = true
	}
	if !names["thread/settings/update"] || !names["turn/steer"] {
		t.Fatalf("methods %v", names)
	}
	if _, err := client.ThreadList(ctx, nil); CodeOf(err) != FailedPrecondition {
		t.Fatalf("before initialize: want FAILED_PRECONDITION, got %v", err)
	}
}

// selfSigned writes a certificate for localhost and 127.0.0.1.
func selfSigned(t *testing.T, dir string) (string, string, *x509.CertPool) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600)
	certificate, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(certificate)
	return certFile, keyFile, pool
}

func TestExampleRuns(t *testing.T) {
	addr := startServer(t)
	out, err := exec.Command("go", "run", "./examples/session", addr).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	text := string(out)
	if !strings.Contains(text, "mode MULTI_AGENT_MODE_PROACTIVE") || !strings.Contains(text, "turn/completed\nturn TURN_STATUS_COMPLETED") {
		t.Fatalf("unexpected output:\n%s", text)
	}
}

// A mutation whose answer is lost is sent again with the same key and
// applied once: the server is killed (fault point) after the change's
// commit and before its answer, then restarted on the same port.
func TestReconnectingClientAppliesAChangeOnce(t *testing.T) {
	addr, startOn := restartableServer(t)
	start := func(fault bool) *exec.Cmd {
		if fault {
			return startOn("THREADWIRE_FAULT_POINTS=idempotency.after-change")
		}
		return startOn()
	}
	first := start(false)
	setup := dial(t, addr)
	ctx := testContext(t)
	started, err := setup.ThreadStart(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	thread := started.GetThread().GetId()
	setup.Close()
	first.Process.Signal(os.Interrupt)
	first.Wait()

	faulty := start(true)
	restarted := make(chan *exec.Cmd, 1)
	go func() {
		faulty.Wait() // killed by the fault point
		restarted <- start(false)
	}()
	policy := DefaultRetryPolicy()
	policy.MaxAttempts = 40
	policy.InitialBackoff = 50 * time.Millisecond
	policy.MaxBackoff = 300 * time.Millisecond
	retrying := NewReconnectingClient(func(ctx context.Context) (*Client, error) { return Dial(ctx, addr) }, policy)
	defer retrying.Close()
	response, err := retrying.Call(ctx, &pb.Request{Params: &pb.Request_TurnStart{TurnStart: &pb.TurnStartParams{
		ThreadId: proto.String(thread), Input: []*pb.UserInput{{Content: &pb.UserInput_Text{Text: "once"}}}}}})
	second := <-restarted
	t.Cleanup(func() { second.Process.Signal(os.Interrupt); second.Wait() })
	if err != nil {
		t.Fatal(err)
	}
	if retrying.Connections() < 2 {
		t.Fatalf("the client never reconnected")
	}
	read, err := dial(t, addr).ThreadRead(ctx, &pb.ThreadReadParams{ThreadId: proto.String(thread), IncludeTurns: proto.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	turns := read.GetThread().GetTurns()
	if len(turns) != 1 || turns[0].GetId() != response.GetTurnStart().GetTurn().GetId() {
		t.Fatalf("want exactly the answered turn, got %d turns", len(turns))
	}
}

// The client's table of mutations matches the server's reflection.
func TestMutatesMatchesReflection(t *testing.T) {
	client := dial(t, startServer(t))
	schema, err := client.ReflectionDescriptors(testContext(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, method := range schema.GetMethods() {
		request := &pb.Request{}
		field := request.ProtoReflect().Descriptor().Fields().ByName(protoreflect.Name(method.GetField()))
		if field == nil {
			t.Fatalf("no Request field %s", method.GetField())
		}
		request.ProtoReflect().Set(field, request.ProtoReflect().NewField(field))
		if Mutates(request) != method.GetMutates() {
			t.Errorf("%s: client says mutates=%v, server %v", method.GetName(), Mutates(request), method.GetMutates())
		}
	}
}

// TestResumingSubscriptionOutlivesKill9: kill -9 of the server and a
// restart on the same port; the subscription hands on every change once,
// in order, including those made before it connected again.
func TestResumingSubscriptionOutlivesKill9(t *testing.T) {
	addr, start := restartableServer(t)
	server := start()
	defer func() { server.Process.Kill(); server.Wait() }()
	ctx := testContext(t)
	writer := dial(t, addr)
	started, err := writer.ThreadStart(ctx, &pb.ThreadStartParams{})
	if err != nil {
		t.Fatal(err)
	}
	id := started.GetThread().GetId()
	heard := make(chan uint64, 100)
	subscription := &ResumingSubscription{
		Threads: []string{id},
		Dial:    func(ctx context.Context) (*Client, error) { return Dial(ctx, addr) },
		Policy:  RetryPolicy{InitialBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Multiplier: 2},
	}
	go subscription.Run(ctx, map[string]uint64{id: 1}, func(note *pb.Notification) {
		if note.ThreadSequence != nil {
			heard <- note.GetThreadSequence()
		}
	})
	update := func(client *Client, model string) {
		if _, err := client.ThreadSettingsUpdate(ctx, &pb.ThreadSettingsUpdateParams{ThreadId: proto.String(id), Model: proto.String(model)}); err != nil {
			t.Fatal(err)
		}
	}
	for n := 0; n < 15; n++ {
		update(writer, fmt.Sprintf("before-%d", n))
	}
	server.Process.Kill()
	server.Wait()
	server = start()
	writer = dial(t, addr)
	for n := 0; n < 15; n++ {
		update(writer, fmt.Sprintf("after-%d", n))
	}
	var numbers []uint64
	for len(numbers) < 30 {
		select {
		case n := <-heard:
			numbers = append(numbers, n)
		case <-ctx.Done():
			t.Fatalf("heard %v before the deadline", numbers)
		}
	}
	for i, n := range numbers {
		if n != uint64(i+2) {
			t.Fatalf("not every change once, in order: %v", numbers)
		}
	}
}

// A child agent spawned while the subscription's connection was down is
// handed on from its first event (the subscription lists each resumed
// thread's children).
func TestResumingSubscriptionHearsChildrenSpawnedWhileAway(t *testing.T) {
	config := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(config, []byte(`{"features": {"multi_agent": true}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, start := restartableServer(t, "--config", config)
	server := start()
	defer func() { server.Process.Kill(); server.Wait() }()
	ctx := testContext(t)
	writer := dial(t, addr)
	started, err := writer.ThreadStart(ctx, &pb.ThreadStartParams{})
	if err != nil {
		t.Fatal(err)
	}
	root := started.GetThread().GetId()
	turn, err := writer.TurnStart(ctx, &pb.TurnStartParams{ThreadId: proto.String(root),
		Input: []*pb.UserInput{{Content: &pb.UserInput_Text{Text: "resolve the runtime"}}}})
	if err != nil {
		t.Fatal(err)
	}
	read := func(client *Client, id string) *pb.Thread {
		result, err := client.ThreadRead(ctx, &pb.ThreadReadParams{ThreadId: proto.String(id), IncludeTurns: proto.Bool(true)})
		if err != nil {
			t.Fatal(err)
		}
		return result.GetThread()
	}
	for turns := read(writer, root).GetTurns(); len(turns) == 0 || turns[len(turns)-1].GetId() != turn.GetTurn().GetId() ||
		turns[len(turns)-1].GetStatus() == pb.TurnStatus_TURN_STATUS_IN_PROGRESS; turns = read(writer, root).GetTurns() {
		if ctx.Err() != nil {
			t.Fatal("the turn did not end")
		}
		time.Sleep(20 * time.Millisecond)
	}
	before := read(writer, root).GetThreadSequence()
	type event struct {
		thread  string
		number  uint64
		started bool
	}
	heard := make(chan event, 1000)
	var away sync.Mutex // held: no connection is made, so what happens meanwhile happens while the subscription is away
	subscription := &ResumingSubscription{
		Threads: []string{root},
		Dial: func(ctx context.Context) (*Client, error) {
			if !away.TryLock() {
				return nil, errors.New("away")
			}
			away.Unlock()
			return Dial(ctx, addr)
		},
		Policy: RetryPolicy{InitialBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, Multiplier: 2},
	}
	go subscription.Run(ctx, map[string]uint64{root: before}, func(note *pb.Notification) {
		if note.ThreadSequence != nil {
			heard <- event{NotificationThreadID(note), note.GetThreadSequence(), note.GetThreadStarted() != nil}
		}
	})
	if _, err := writer.ThreadSettingsUpdate(ctx, &pb.ThreadSettingsUpdateParams{ThreadId: proto.String(root), Model: proto.String("heard")}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-heard:
	case <-ctx.Done():
		t.Fatal("the subscription heard nothing")
	}
	away.Lock()
	server.Process.Kill()
	server.Wait()
	server = start()
	writer = dial(t, addr)
	spawned, err := writer.AgentSpawn(ctx, &pb.AgentSpawnParams{ParentThreadId: proto.String(root)})
	if err != nil {
		t.Fatal(err)
	}
	child := spawned.GetThread().GetId()
	for n := 0; n < 3; n++ {
		if _, err := writer.ThreadSettingsUpdate(ctx, &pb.ThreadSettingsUpdateParams{ThreadId: proto.String(child), Model: proto.String(fmt.Sprintf("away-%d", n))}); err != nil {
			t.Fatal(err)
		}
	}
	away.Unlock()
	head := read(writer, child).GetThreadSequence()
	var numbers []uint64
	firstStarted := false
	for len(numbers) == 0 || numbers[len(numbers)-1] != head {
		select {
		case e := <-heard:
			if e.thread == child {
				if len(numbers) == 0 {
					firstStarted = e.started
				}
				numbers = append(numbers, e.number)
			}
		case <-ctx.Done():
			t.Fatalf("heard %v of child %s (newest %d) before the deadline", numbers, child, head)
		}
	}
	for i, n := range numbers {
		if n != uint64(i+1) {
			t.Fatalf("not every event of the child once, in order, from its first: %v", numbers)
		}
	}
	if !firstStarted {
		t.Fatal("the child's first event is not thread/started")
	}
}
