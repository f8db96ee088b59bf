// A second, independent checker of the fault tests' histories (issue 46):
// written in Go from the published algorithms, not from checker.py, so a
// bug in one is unlikely to be repeated in the other. The chaos runs judge
// every history with both and require the same verdict.
//
//	gocheck HISTORY SETUP CAP
//
// HISTORY is the workload's JSON lines (invoke, then ok / fail / info);
// SETUP the workload's setup JSON (initial register values, the spawn root
// and its final children); CAP the agent cap. Prints one line, "VALID", "INVALID" or
// "UNKNOWN", then one anomaly a line. Exit status 0 whatever the verdict.
//
// What it checks:
//   - registers ("THREAD:model", "THREAD:cwd"): linearizability, by the
//     Wing & Gong search with Lowe's memoization (as in porcupine): a call
//     is linearized only if every earlier-returning call already is; states
//     seen with the same set of linearized calls are not searched twice.
//     Failed calls are left out; unanswered ones return at infinity.
//   - snapshots: a thread's (model, cwd) as one register, each write
//     setting one field, each thread/read reading both.
//   - lists (a thread's turns): Elle's list-append checks on the reads; an
//     enqueue (turn/start ENQUEUE) is an append that may land later: no
//     stale-read check for it, and a plain append may pass it.
//   - notices (what each subscribed connection heard): a settings notice is
//     the state at its commit, so a snapshot whose call starts when the later
//     of its two values' writes was invoked and returns when it arrived; it
//     names no unwritten or refused value; no connection hears one twice;
//     each field's values reach every connection in one order (Kahn's
//     topological sort over each connection's order, real time between
//     acknowledged writes, initial value first, final read last). A turn
//     notice names an element of the longest list read, once per
//     connection, in that list's order.
//   - caps: final children within the cap, no acknowledged spawn missing.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"os"
	"sort"
	"strings"
)

const budget = 2_000_000

type op struct {
	process, f, key string
	value           json.RawMessage
	invoked, done   float64
	outcome         string
}

type event struct {
	Type    string          `json:"type"`
	ID      int             `json:"id"`
	Process string          `json:"process"`
	F       string          `json:"f"`
	Key     string          `json:"key"`
	Value   json.RawMessage `json:"value"`
	Time    float64         `json:"time"`
}

func load(path string) ([]*op, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	pending := map[int]*op{}
	var ops []*op
	scanner := bufio.NewScanner(file)
	scanner.Buffer(make([]byte, 1<<20), 1<<26)
	for scanner.Scan() {
		line := strings.TrimSpace(scanner.Text())
		if line == "" {
			continue
		}
		var e event
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			return nil, err
		}
		if e.Type == "invoke" {
			o := &op{process: e.Process, f: e.F, key: e.Key, value: e.Value, invoked: e.Time, done: math.Inf(1), outcome: "info"}
			pending[e.ID] = o
			ops = append(ops, o)
			continue
		}
		o := pending[e.ID]
		if o == nil {
			return nil, fmt.Errorf("an end without an invocation: %s", line)
		}
		delete(pending, e.ID)
		o.outcome = e.Type
		if e.Type == "ok" || e.Type == "fail" {
			o.done = e.Time
		}
		if e.Type == "ok" && (o.f == "read" || o.f == "list" || o.f == "spawn" || o.f == "snapshot") {
			o.value = e.Value
		}
	}
	return ops, scanner.Err()
}

// canonical JSON of a value, so equal values compare equal as strings.
func canonical(raw json.RawMessage) string {
	if len(raw) == 0 {
		return "null"
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return string(raw)
	}
	out, _ := json.Marshal(v)
	return string(out)
}

// ---- linearizability ------------------------------------------------------

// A call of the search: apply(state) says whether it may happen in that
// state and the state after it.
type call struct {
	start, end float64
	apply      func(state string) (bool, string)
}

type entry struct {
	call       int
	isReturn   bool
	time       float64
	prev, next *entry
	match      *entry // a call's return
}

// linearizable: 1 yes, 0 no, -1 undecided within the budget.
func linearizable(calls []call, initial string) int {
	var entries []*entry
	for i, c := range calls {
		callEntry := &entry{call: i, time: c.start}
		returnEntry := &entry{call: i, isReturn: true, time: c.end}
		callEntry.match = returnEntry
		entries = append(entries, callEntry, returnEntry)
	}
	sort.SliceStable(entries, func(a, b int) bool {
		if entries[a].time != entries[b].time {
			return entries[a].time < entries[b].time
		}
		return !entries[a].isReturn && entries[b].isReturn // calls first at equal times
	})
	head := &entry{call: -1}
	last := head
	for _, e := range entries {
		last.next = e
		e.prev = last
		last = e
	}
	lift := func(e *entry) { // takes a call and its return out of the list
		e.prev.next = e.next
		if e.next != nil {
			e.next.prev = e.prev
		}
		r := e.match
		r.prev.next = r.next
		if r.next != nil {
			r.next.prev = r.prev
		}
	}
	unlift := func(e *entry) { // puts them back
		r := e.match
		r.prev.next = r
		if r.next != nil {
			r.next.prev = r
		}
		e.prev.next = e
		if e.next != nil {
			e.next.prev = e
		}
	}
	type frame struct {
		e     *entry
		state string
	}
	var stack []frame
	linearized := new(big.Int)
	seen := map[string]bool{}
	state := initial
	current := head.next
	steps := 0
	for head.next != nil {
		steps++
		if steps > budget {
			return -1
		}
		if current == nil {
			return 0
		}
		if !current.isReturn {
			ok, next := calls[current.call].apply(state)
			if ok {
				with := new(big.Int).SetBit(linearized, current.call, 1)
				key := with.String() + "\x00" + next
				if !seen[key] {
					seen[key] = true
					stack = append(stack, frame{current, state})
					state = next
					linearized = with
					lift(current)
					current = head.next
					continue
				}
			}
			current = current.next
			continue
		}
		// A return reached before its call was linearized: backtrack.
		if len(stack) == 0 {
			return 0
		}
		top := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		state = top.state
		linearized = new(big.Int).SetBit(linearized, top.e.call, 0)
		unlift(top.e)
		current = top.e.next
	}
	return 1
}

func returnOf(o *op) float64 {
	if o.outcome == "ok" {
		return o.done
	}
	return math.Inf(1) // unanswered: it may take effect at any later moment
}

func registerCalls(ops []*op) []call {
	var calls []call
	for _, o := range ops {
		o := o
		value := canonical(o.value)
		switch {
		case o.f == "write" && o.outcome != "fail":
			calls = append(calls, call{o.invoked, returnOf(o), func(string) (bool, string) { return true, value }})
		case o.f == "read" && o.outcome == "ok":
			calls = append(calls, call{o.invoked, o.done, func(s string) (bool, string) { return s == value, s }})
		}
	}
	return calls
}

// ---- the whole history -----------------------------------------------------

type setup struct {
	Initial   map[string]json.RawMessage `json:"initial"`
	SpawnRoot string                     `json:"spawn_root"`
	Children  []string                   `json:"children"`
}

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: gocheck HISTORY SETUP CAP")
		os.Exit(2)
	}
	var cap int
	if _, err := fmt.Sscan(os.Args[3], &cap); err != nil {
		fmt.Fprintln(os.Stderr, "gocheck: CAP:", err)
		os.Exit(2)
	}
	ops, err := load(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "gocheck:", err)
		os.Exit(2)
	}
	raw, err := os.ReadFile(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "gocheck:", err)
		os.Exit(2)
	}
	var s setup
	if err := json.Unmarshal(raw, &s); err != nil {
		fmt.Fprintln(os.Stderr, "gocheck:", err)
		os.Exit(2)
	}
	anomalies, undecided := check(ops, s, cap)
	switch {
	case len(anomalies) > 0:
		fmt.Println("INVALID")
	case len(undecided) > 0:
		fmt.Println("UNKNOWN")
	default:
		fmt.Println("VALID")
	}
	for _, a := range append(anomalies, undecided...) {
		fmt.Println(a)
	}
}

func check(ops []*op, s setup, cap int) (anomalies, undecided []string) {
	byKey := map[string][]*op{}
	snapshots := map[string][]*op{}
	lists := map[string][]*op{}
	var spawns []*op
	for _, o := range ops {
		switch o.f {
		case "write", "read":
			byKey[o.key] = append(byKey[o.key], o)
		case "snapshot":
			snapshots[o.key] = append(snapshots[o.key], o)
		case "append", "enqueue", "list":
			lists[o.key] = append(lists[o.key], o)
		case "spawn":
			spawns = append(spawns, o)
		}
	}
	initial := func(key string) string { return canonical(s.Initial[key]) }

	for _, key := range sortedKeys(byKey) {
		switch linearizable(registerCalls(byKey[key]), initial(key)) {
		case 0:
			anomalies = append(anomalies, key+": not linearizable")
		case -1:
			undecided = append(undecided, key+": undecided within the budget")
		}
	}

	orders := map[string][]string{}
	for _, key := range sortedKeys(lists) {
		found, longest := checkList(key, lists[key])
		anomalies = append(anomalies, found...)
		orders[key] = longest
	}
	anomalies = append(anomalies, checkNotices(ops, byKey, orders, snapshots, initial)...)

	for _, thread := range sortedKeys(snapshots) {
		var calls []call
		for _, o := range snapshots[thread] {
			if o.outcome != "ok" {
				continue
			}
			var pair struct {
				Model json.RawMessage `json:"model"`
				Cwd   json.RawMessage `json:"cwd"`
			}
			_ = json.Unmarshal(o.value, &pair)
			want := canonical(pair.Model) + "\x00" + canonical(pair.Cwd)
			calls = append(calls, call{o.invoked, o.done, func(st string) (bool, string) { return st == want, st }})
		}
		for field, key := range []string{thread + ":model", thread + ":cwd"} {
			field := field
			for _, o := range byKey[key] {
				if o.f != "write" || o.outcome == "fail" {
					continue
				}
				value := canonical(o.value)
				calls = append(calls, call{o.invoked, returnOf(o), func(st string) (bool, string) {
					parts := strings.SplitN(st, "\x00", 2)
					parts[field] = value
					return true, parts[0] + "\x00" + parts[1]
				}})
			}
		}
		switch linearizable(calls, initial(thread+":model")+"\x00"+initial(thread+":cwd")) {
		case 0:
			anomalies = append(anomalies, thread+": a snapshot of (model, cwd) fits no moment")
		case -1:
			undecided = append(undecided, thread+": snapshots undecided within the budget")
		}
	}

	if s.SpawnRoot != "" {
		children := map[string]bool{}
		for _, c := range s.Children {
			children[c] = true
		}
		if len(s.Children) > cap {
			anomalies = append(anomalies, fmt.Sprintf("%s: %d children, over the cap of %d", s.SpawnRoot, len(s.Children), cap))
		}
		for _, o := range spawns {
			var child string
			_ = json.Unmarshal(o.value, &child)
			if o.key == s.SpawnRoot && o.outcome == "ok" && !children[child] {
				anomalies = append(anomalies, fmt.Sprintf("%s: acknowledged child %s is gone", s.SpawnRoot, child))
			}
		}
	}
	return anomalies, undecided
}

// checkList: the reads of one thread's turns against its appends.
func checkList(key string, ops []*op) (anomalies []string, longest []string) {
	appended := map[string]*op{}
	var reads []*op
	var appends []*op
	for _, o := range ops {
		if o.f == "append" || o.f == "enqueue" {
			var v string
			_ = json.Unmarshal(o.value, &v)
			appended[v] = o
			appends = append(appends, o)
		} else if o.outcome == "ok" {
			reads = append(reads, o)
		}
	}
	values := func(o *op) []string {
		var v []string
		_ = json.Unmarshal(o.value, &v)
		return v
	}
	valueOf := func(o *op) string {
		var v string
		_ = json.Unmarshal(o.value, &v)
		return v
	}
	for _, r := range reads {
		seen := map[string]bool{}
		list := values(r)
		for _, element := range list {
			if seen[element] {
				anomalies = append(anomalies, fmt.Sprintf("%s: %q twice in one read", key, element))
			}
			seen[element] = true
			if appended[element] == nil {
				anomalies = append(anomalies, fmt.Sprintf("%s: %q read, never appended", key, element))
			}
		}
		short, long := list, longest
		if len(short) > len(long) {
			short, long = long, short
		}
		for i := range short {
			if short[i] != long[i] {
				anomalies = append(anomalies, fmt.Sprintf("%s: two reads disagree at position %d", key, i))
				break
			}
		}
		if len(list) > len(longest) {
			longest = list
		}
	}
	for _, a := range reads {
		for _, b := range reads {
			if b.invoked > a.done && len(values(b)) < len(values(a)) {
				anomalies = append(anomalies, fmt.Sprintf("%s: a read shorter than one that ended before it began", key))
			}
		}
	}
	position := map[string]int{}
	for i, element := range longest {
		position[element] = i
	}
	for _, a := range appends {
		v := valueOf(a)
		_, present := position[v]
		if a.outcome == "fail" && present {
			anomalies = append(anomalies, fmt.Sprintf("%s: %q refused, yet there", key, v))
		}
		if a.outcome != "ok" {
			continue
		}
		if !present {
			anomalies = append(anomalies, fmt.Sprintf("%s: acknowledged %q in no read", key, v))
		}
		// An enqueued turn starts only when those ahead of it end: a read
		// right after its acknowledgement need not hold it.
		for _, r := range reads {
			if a.f == "append" && r.invoked > a.done && !contains(values(r), v) {
				anomalies = append(anomalies, fmt.Sprintf("%s: acknowledged %q missing from a later read", key, v))
				break
			}
		}
		for _, b := range appends {
			w := valueOf(b)
			_, bPresent := position[w]
			// A plain turn/start may pass a queued one while the thread is idle.
			passes := a.f == "enqueue" && b.f == "append"
			if b.outcome == "ok" && !passes && a.done < b.invoked && present && bPresent && position[v] > position[w] {
				anomalies = append(anomalies, fmt.Sprintf("%s: %q before %q, appended after it was acknowledged", key, w, v))
			}
		}
	}
	return anomalies, longest
}

// checkNotices judges what subscribers heard; each settings notice also
// becomes a snapshot (added to `snapshots`) for the snapshot check.
func checkNotices(ops []*op, byKey map[string][]*op, orders map[string][]string, snapshots map[string][]*op,
	initial func(string) string) (anomalies []string) {
	writes := map[string]*op{}
	finals := map[string]string{}
	for key, list := range byKey {
		for _, o := range list {
			if o.f == "write" {
				writes[key+"\x00"+canonical(o.value)] = o
			} else if o.process == "final" && o.outcome == "ok" {
				finals[key] = canonical(o.value)
			}
		}
	}
	var notices []*op
	for _, o := range ops {
		if o.f == "notice" {
			notices = append(notices, o)
		}
	}
	sort.SliceStable(notices, func(i, j int) bool { return notices[i].invoked < notices[j].invoked })
	heardTwice := map[string]bool{}
	lastIndex := map[string]int{}
	lastNumber := map[string]uint64{} // subscriber and thread -> the event number heard last
	// field key -> connection -> values in the order heard (repeats folded)
	heard := map[string]map[string][]string{}
	for _, n := range notices {
		var v struct {
			Kind  string          `json:"kind"`
			Input string          `json:"input"`
			Model json.RawMessage `json:"model"`
			Cwd   json.RawMessage `json:"cwd"`
			// The thread's event number, if the notice had one.
			Number *uint64 `json:"number"`
		}
		_ = json.Unmarshal(n.value, &v)
		if v.Number != nil {
			// A subscriber's connections ("s0.1", "s0.2") resume by number: one sequence.
			subscriber := strings.SplitN(n.process, ".", 2)[0] + "\x00" + n.key
			if last, ok := lastNumber[subscriber]; ok && *v.Number <= last {
				anomalies = append(anomalies, fmt.Sprintf("%s: subscriber %s heard event %d after event %d", n.key,
					strings.SplitN(n.process, ".", 2)[0], *v.Number, last))
			} else {
				lastNumber[subscriber] = *v.Number
			}
		}
		if v.Kind == "turn" {
			once := n.process + "\x00" + n.key + "\x00turn\x00" + v.Input
			if heardTwice[once] {
				anomalies = append(anomalies, fmt.Sprintf("%s: %s heard turn %q twice", n.key, n.process, v.Input))
				continue
			}
			heardTwice[once] = true
			index := -1
			for i, element := range orders[n.key] {
				if element == v.Input {
					index = i
				}
			}
			if index < 0 {
				anomalies = append(anomalies, fmt.Sprintf("%s: %s heard turn %q, in no read", n.key, n.process, v.Input))
				continue
			}
			conn := n.process + "\x00" + n.key
			if last, ok := lastIndex[conn]; ok && index < last {
				anomalies = append(anomalies, fmt.Sprintf("%s: %s heard turn %q out of order", n.key, n.process, v.Input))
			}
			lastIndex[conn] = index
			continue
		}
		values := []string{canonical(v.Model), canonical(v.Cwd)}
		once := n.process + "\x00" + n.key + "\x00settings\x00" + values[0] + "\x00" + values[1]
		if heardTwice[once] {
			anomalies = append(anomalies, fmt.Sprintf("%s: %s heard settings %v twice", n.key, n.process, values))
			continue
		}
		heardTwice[once] = true
		start, real := 0.0, true
		for i, field := range []string{":model", ":cwd"} {
			key := n.key + field
			if heard[key] == nil {
				heard[key] = map[string][]string{}
			}
			seq := heard[key][n.process]
			if len(seq) == 0 || seq[len(seq)-1] != values[i] {
				heard[key][n.process] = append(seq, values[i])
			}
			if values[i] == initial(key) {
				continue
			}
			w := writes[key+"\x00"+values[i]]
			if w == nil || w.outcome == "fail" {
				anomalies = append(anomalies, fmt.Sprintf("%s: %s heard %s, never written or refused", key, n.process, values[i]))
				real = false
				continue
			}
			start = math.Max(start, w.invoked)
		}
		// One snapshot per pair, however many connections heard it: they
		// tell of one commit (the first arrival bounds it).
		commit := n.key + "\x00" + values[0] + "\x00" + values[1]
		if real && !heardTwice[commit] {
			heardTwice[commit] = true
			value, _ := json.Marshal(map[string]json.RawMessage{"model": json.RawMessage(values[0]), "cwd": json.RawMessage(values[1])})
			snapshots[n.key] = append(snapshots[n.key], &op{process: n.process, f: "snapshot", key: n.key, value: value,
				invoked: start, done: n.invoked, outcome: "ok"})
		}
	}
	keys := make([]string, 0, len(heard))
	for key := range heard {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for _, key := range keys {
		if !oneOrder(key, heard[key], writes, initial(key), finals[key]) {
			anomalies = append(anomalies, key+": subscribers heard its values in orders no single commit order explains")
		}
	}
	return anomalies
}

// oneOrder: whether the "committed before" relation among the heard values
// of one field has no cycle (Kahn: repeatedly remove a value nothing precedes).
func oneOrder(key string, byConnection map[string][]string, writes map[string]*op, initial, final string) bool {
	nodes := map[string]bool{}
	for _, seq := range byConnection {
		for _, v := range seq {
			nodes[v] = true
		}
	}
	edges := map[string]map[string]bool{}
	add := func(a, b string) {
		if edges[a] == nil {
			edges[a] = map[string]bool{}
		}
		edges[a][b] = true
	}
	for _, seq := range byConnection {
		for i := 1; i < len(seq); i++ {
			add(seq[i-1], seq[i])
		}
	}
	for a := range nodes {
		for b := range nodes {
			if a == b {
				continue
			}
			wa, wb := writes[key+"\x00"+a], writes[key+"\x00"+b]
			switch {
			case a == initial:
				add(a, b)
			case b == final:
				add(a, b)
			case wa != nil && wb != nil && wa.outcome == "ok" && wa.done < wb.invoked:
				add(a, b)
			}
		}
	}
	indegree := map[string]int{}
	for a := range nodes {
		for b := range edges[a] {
			if a != b {
				indegree[b]++
			}
		}
	}
	var ready []string
	for v := range nodes {
		if indegree[v] == 0 {
			ready = append(ready, v)
		}
	}
	removed := 0
	for len(ready) > 0 {
		v := ready[len(ready)-1]
		ready = ready[:len(ready)-1]
		removed++
		for b := range edges[v] {
			if b == v {
				continue
			}
			indegree[b]--
			if indegree[b] == 0 {
				ready = append(ready, b)
			}
		}
	}
	return removed == len(nodes)
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

func sortedKeys(m map[string][]*op) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
