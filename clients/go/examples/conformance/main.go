// Command conformance runs the cross-language conformance scenario
// (integration/conformance/README.md) and prints its transcript.
// Usage: go run ./examples/conformance HOST:PORT
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	threadwire "github.com/threadwire/threadwire/clients/go"
	pb "github.com/threadwire/threadwire/clients/go/threadwirepb"
	"google.golang.org/protobuf/proto"
)

func modeName(settings interface{ GetMultiAgentMode() pb.MultiAgentMode }, set bool) string {
	if !set {
		return "none"
	}
	return settings.GetMultiAgentMode().String()
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client, err := threadwire.Dial(ctx, os.Args[1], threadwire.WithClientInfo("conformance-go", "1.0"),
		threadwire.WithOptOut("item/agent_message/delta", "thread/token_usage/updated"))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	info := client.ServerInfo()
	fmt.Printf("initialize: protocol_version=%d server=%s\n", info.GetProtocolVersion(), info.GetServerInfo().GetName())

	started, err := client.ThreadStart(ctx, &pb.ThreadStartParams{MultiAgentMode: pb.MultiAgentMode_MULTI_AGENT_MODE_PROACTIVE.Enum()})
	if err != nil {
		log.Fatal(err)
	}
	threadID := started.GetThread().GetId()
	fmt.Printf("thread/start: selected_mode=%s\n", modeName(started, started.MultiAgentMode != nil))

	turn, err := client.TurnStart(ctx, &pb.TurnStartParams{ThreadId: proto.String(threadID),
		Input: []*pb.UserInput{{Content: &pb.UserInput_Text{Text: "conformance"}}}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("turn/start: status=%s\n", turn.GetTurn().GetStatus())
	var methods []string
	var completed *pb.Turn
	for note := range client.Notifications() {
		methods = append(methods, threadwire.NotificationMethod(note))
		if done := note.GetTurnCompleted(); done != nil {
			completed = done.GetTurn()
			break
		}
	}
	fmt.Printf("notifications: %s\n", strings.Join(methods, " "))
	var items []string
	for _, item := range completed.GetItems() {
		items = append(items, item.GetType().String())
	}
	fmt.Printf("turn/completed: status=%s items=%s\n", completed.GetStatus(), strings.Join(items, ","))

	updated, err := client.ThreadSettingsUpdate(ctx, &pb.ThreadSettingsUpdateParams{ThreadId: proto.String(threadID),
		MultiAgentModeUpdate: &pb.ThreadSettingsUpdateParams_ClearMultiAgentMode{ClearMultiAgentMode: true}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("thread/settings/update: changed=%t selected_mode=%s\n", updated.GetChanged(),
		modeName(updated.GetSettings(), updated.GetSettings().MultiAgentMode != nil))

	// 1,000 requests written before any answer is read, then one whose 1 ms
	// deadline cannot be met: its answer queues behind the 1,000.
	calls := make([]*threadwire.Pending, 1000)
	for i := range calls {
		request := &pb.Request{Params: &pb.Request_HealthCheck{HealthCheck: &pb.HealthCheckParams{}}}
		if i%2 == 0 {
			request = &pb.Request{Params: &pb.Request_ThreadRead{ThreadRead: &pb.ThreadReadParams{ThreadId: proto.String(threadID)}}}
		}
		calls[i] = client.Go(ctx, request)
	}
	short, cancelShort := context.WithTimeout(ctx, time.Millisecond)
	defer cancelShort()
	late := client.Go(short, &pb.Request{Params: &pb.Request_ThreadRead{ThreadRead: &pb.ThreadReadParams{ThreadId: proto.String(threadID)}}})
	answered, matched, ok := 0, true, true
	var last uint64
	for i, call := range calls {
		response, err := call.Wait()
		if err != nil {
			log.Fatal(err)
		}
		answered++
		if response.GetId() <= last || (i%2 == 0) != (response.GetThreadRead().GetThread().GetId() == threadID) ||
			(i%2 == 1) != (response.GetHealthCheck() != nil) {
			matched = false
		}
		last = response.GetId()
		if response.GetCode() != 0 {
			ok = false
		}
	}
	verdict := map[bool]string{true: "matched", false: "mismatched"}
	codes := map[bool]string{true: "all_ok", false: "errors"}
	fmt.Printf("pipelined: sent=1000 answered=%d ids=%s codes=%s\n", answered, verdict[matched], codes[ok])
	_, err = late.Wait()
	fmt.Printf("deadline: code=%d\n", uint32(threadwire.CodeOf(err)))

	_, err = client.ThreadRead(ctx, &pb.ThreadReadParams{ThreadId: proto.String("no-such-thread")})
	fmt.Printf("thread/read no-such-thread: code=%d\n", uint32(threadwire.CodeOf(err)))
}
