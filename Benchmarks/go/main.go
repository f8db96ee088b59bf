// Command bench drives a threadwire server with the Go client: closed loop
// (depth 1) or pipelined (depth N calls in flight per connection), printing
// one JSON line like Benchmarks/c/frame_load.c.
//
//	bench ADDR CONNECTIONS SECONDS health|read DEPTH [THREAD_ID]
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"

	threadwire "github.com/threadwire/threadwire/clients/go"
	pb "github.com/threadwire/threadwire/clients/go/threadwirepb"
	"google.golang.org/protobuf/proto"
)

func main() {
	if len(os.Args) < 6 {
		fmt.Fprintln(os.Stderr, "usage: bench ADDR CONNECTIONS SECONDS health|read DEPTH [THREAD_ID]")
		os.Exit(2)
	}
	addr := os.Args[1]
	connections, _ := strconv.Atoi(os.Args[2])
	seconds, _ := strconv.Atoi(os.Args[3])
	method := os.Args[4]
	depth, _ := strconv.Atoi(os.Args[5])
	request := &pb.Request{Params: &pb.Request_HealthCheck{HealthCheck: &pb.HealthCheckParams{}}}
	if method == "read" {
		request = &pb.Request{Params: &pb.Request_ThreadRead{ThreadRead: &pb.ThreadReadParams{ThreadId: proto.String(os.Args[6])}}}
	}
	ctx := context.Background()
	clients := make([]*threadwire.Client, connections)
	for i := range clients {
		client, err := threadwire.Dial(ctx, addr, threadwire.WithClientInfo("go-bench", "1"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		clients[i] = client
	}
	var mu sync.Mutex
	var latencies []time.Duration
	errors := 0
	var wg sync.WaitGroup
	warmup := time.Now().Add(500 * time.Millisecond)
	end := warmup.Add(time.Duration(seconds) * time.Second)
	for _, client := range clients {
		for d := 0; d < depth; d++ {
			wg.Add(1)
			go func(client *threadwire.Client) {
				defer wg.Done()
				var mine []time.Duration
				failed := 0
				for {
					started := time.Now()
					if started.After(end) {
						break
					}
					if _, err := client.Call(ctx, request); err != nil {
						failed++
					}
					if started.After(warmup) {
						mine = append(mine, time.Since(started))
					}
				}
				mu.Lock()
				latencies = append(latencies, mine...)
				errors += failed
				mu.Unlock()
			}(client)
		}
	}
	wg.Wait()
	for _, client := range clients {
		client.Close()
	}
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	pick := func(q float64) int64 {
		if len(latencies) == 0 {
			return 0
		}
		return latencies[int(q*float64(len(latencies)-1))].Microseconds()
	}
	out, _ := json.Marshal(map[string]any{
		"client": "go", "connections": connections, "depth": depth,
		"requests_per_second": int(float64(len(latencies)) / float64(seconds)),
		"p50_us": pick(0.50), "p99_us": pick(0.99), "errors": errors,
	})
	fmt.Println(string(out))
}
