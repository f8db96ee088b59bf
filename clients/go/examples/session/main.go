// Command session starts a thread with a multi-agent mode, runs one turn and
// prints what the server reports. Usage: go run ./examples/session [HOST:PORT]
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	threadwire "github.com/threadwire/threadwire/clients/go"
	pb "github.com/threadwire/threadwire/clients/go/threadwirepb"
	"google.golang.org/protobuf/proto"
)

func main() {
	addr := "127.0.0.1:7420"
	if len(os.Args) > 1 {
		addr = os.Args[1]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	options := []threadwire.Option{threadwire.WithClientInfo("go-example", "1.0")}
	if token := os.Getenv("THREADWIRE_AUTH_TOKEN"); token != "" {
		options = append(options, threadwire.WithToken(token))
	}
	client, err := threadwire.Dial(ctx, addr, options...)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	started, err := client.ThreadStart(ctx, &pb.ThreadStartParams{MultiAgentMode: pb.MultiAgentMode_MULTI_AGENT_MODE_PROACTIVE.Enum()})
	if err != nil {
		log.Fatal(err)
	}
	threadID := started.GetThread().GetId()
	fmt.Printf("thread %s mode %s\n", threadID, started.GetMultiAgentMode())

	turn, err := client.TurnStart(ctx, &pb.TurnStartParams{ThreadId: proto.String(threadID),
		Input: []*pb.UserInput{{Content: &pb.UserInput_Text{Text: "hello from Go"}}}})
	if err != nil {
		log.Fatal(err)
	}
	for note := range client.Notifications() {
		fmt.Println(threadwire.NotificationMethod(note))
		if done := note.GetTurnCompleted(); done != nil && done.GetTurn().GetId() == turn.GetTurn().GetId() {
			fmt.Printf("turn %s\n", done.GetTurn().GetStatus())
			break
		}
	}
}
