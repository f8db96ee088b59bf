// The operator's console: a page of the web listener (path /) that speaks
// the protocol itself over /ws with the TypeScript client's browser build.
// No API of its own: what it shows and changes goes through the calls any
// client makes, under the principal of the token it signs in with.
import {
  ApprovalDecision,
  ApprovalPolicy,
  Code,
  ItemStatus,
  ItemType,
  McpServerState,
  MultiAgentMode,
  MultiAgentRuntime,
  StatusError,
  ThreadActiveFlag,
  ThreadStatusType,
  TurnStatus,
  WebSocketClient,
  notificationThreadId,
  resumingSubscription,
  type ApprovalParams,
  type ApprovalResult,
  type ClusterStatusResult,
  type Notification,
  type ServerRequest,
  type Thread,
  type ThreadSettings,
  type Turn,
  type UserInputParams,
  type UserInputResult,
} from "../../src/browser.js";
import { fill, h, label, when } from "./dom.js";
import { agentTree, barChart, type TreeNode } from "./graphics.js";

const TOKEN_KEY = "threadwire.console.token";
const main = document.getElementById("main")!;
const who = document.getElementById("who")!;
const link = document.getElementById("link")!;
const pendingList = document.getElementById("pending-list")!;
const socketURL = `${location.protocol === "https:" ? "wss:" : "ws:"}//${location.host}/ws`;

/** The connection for calls, opened again when it ends. */
let calls: WebSocketClient | undefined;
let principal: string | undefined;
/** Marked `operator` in the tokens file: reads every principal's threads. */
let isOperator = false;

async function client(): Promise<WebSocketClient> {
  const token = sessionStorage.getItem(TOKEN_KEY) ?? undefined;
  if (calls === undefined || calls.ended) {
    calls = await WebSocketClient.connect({ url: socketURL, token, clientName: "threadwire-console" });
    principal = calls.serverInfo?.principal;
    isOperator = calls.serverInfo?.isOperator === true;
    // The cluster view is an operator's (or the one user's, without principals).
    document.getElementById("cluster-link")?.toggleAttribute("hidden", !(isOperator || !principal));
    fill(who, principal ? `signed in as ${principal}${isOperator ? " (operator)" : ""}` : "");
  }
  return calls;
}

// ---- pending requests of the open tree: answered from the page ----

interface Pending {
  request: ServerRequest;
  element: HTMLElement;
  answer(result: ApprovalResult | UserInputResult): void;
}
const pending = new Map<string, Pending>();

function offer<T extends ApprovalResult | UserInputResult>(request: ServerRequest, build: (answer: (result: T) => void) => HTMLElement): Promise<T> {
  return new Promise<T>((resolve) => {
    const id = request.id ?? "";
    pending.get(id)?.element.remove();
    const settle = (result: T) => {
      pending.get(id)?.element.remove();
      pending.delete(id);
      renderPendingEmpty();
      resolve(result);
    };
    const element = build(settle);
    pending.set(id, { request, element, answer: settle as (result: ApprovalResult | UserInputResult) => void });
    pendingList.append(element);
    renderPendingEmpty();
  });
}

function renderPendingEmpty(): void {
  document.getElementById("pending-empty")!.hidden = pending.size > 0;
}

function requestHeading(request: ServerRequest, what: string): HTMLElement {
  return h("div", { class: "request-head" },
    h("strong", {}, what), " in ",
    h("a", { href: `#/thread/${request.threadId}` }, request.taskPath || request.threadId || "?"));
}

function askApproval(params: ApprovalParams, request: ServerRequest): Promise<ApprovalResult> {
  return offer<ApprovalResult>(request, (answer) => {
    const reason = h("input", { type: "text", placeholder: "reason to decline", "aria-label": "reason to decline" });
    const button = (text: string, decision: ApprovalDecision, testid: string) => {
      const element = h("button", { type: "button", "data-testid": testid }, text);
      element.addEventListener("click", () => answer({ decision, reason: decision === ApprovalDecision.APPROVAL_DECISION_DECLINE ? reason.value || undefined : undefined }));
      return element;
    };
    return h("li", { class: "request", "data-request-id": request.id, "data-kind": "approval" },
      requestHeading(request, `approve ${params.tool ?? "a tool"}?`),
      h("pre", { class: "arguments" }, params.arguments ?? ""),
      h("div", { class: "actions" },
        button("Approve", ApprovalDecision.APPROVAL_DECISION_APPROVE, "approve"),
        button("Approve for tree", ApprovalDecision.APPROVAL_DECISION_APPROVE_FOR_TREE, "approve-tree"),
        reason,
        button("Decline", ApprovalDecision.APPROVAL_DECISION_DECLINE, "decline")));
  });
}

function askUserInput(params: UserInputParams, request: ServerRequest): Promise<UserInputResult> {
  return offer<UserInputResult>(request, (answer) => {
    const text = h("input", { type: "text", "aria-label": "answer" });
    const send = h("button", { type: "button", "data-testid": "answer" }, "Answer");
    send.addEventListener("click", () => answer({ answer: text.value }));
    const choices = (params.choices ?? []).map((choice) => {
      const button = h("button", { type: "button", class: "choice" }, choice);
      button.addEventListener("click", () => answer({ answer: choice }));
      return button;
    });
    return h("li", { class: "request", "data-request-id": request.id, "data-kind": "user-input" },
      requestHeading(request, "question"),
      h("p", {}, params.question ?? ""),
      h("div", { class: "actions" }, ...choices, text, send));
  });
}

// ---- the live subscription to the open thread's tree ----

let following: { root: string; stop: AbortController } | undefined;
let onNotification: (note: Notification) => void = () => {};

function follow(root: string): void {
  if (following?.root === root) return;
  following?.stop.abort();
  for (const entry of pending.values()) entry.element.remove();
  pending.clear();
  renderPendingEmpty();
  const stop = new AbortController();
  following = { root, stop };
  const token = sessionStorage.getItem(TOKEN_KEY) ?? undefined;
  const dial = async (signal?: AbortSignal) => {
    fill(link, "connecting…");
    link.className = "link connecting";
    const session = await WebSocketClient.connect({
      url: socketURL, token, signal, clientName: "threadwire-console-live",
      handlers: { approval: askApproval, userInput: askUserInput },
    });
    fill(link, "live");
    link.className = "link live";
    return session;
  };
  void (async () => {
    for await (const note of resumingSubscription([root], { dial, signal: stop.signal })) {
      if (note.payload?.case === "serverRequestResolved") {
        const id = note.payload.value.requestId ?? "";
        pending.get(id)?.element.remove();
        pending.delete(id);
        renderPendingEmpty();
      }
      onNotification(note);
    }
  })().catch((error) => showError(error));
  // A dropped connection: resumingSubscription dials again and resumes after
  // the last event it handed over, so nothing is missed or repeated.
  stop.signal.addEventListener("abort", () => {
    fill(link, "");
    link.className = "link";
  });
}

// ---- pages ----

function showError(error: unknown): void {
  const message = error instanceof StatusError ? `${Code[error.code]}: ${error.details}` : String(error);
  const banner = document.getElementById("error")!;
  fill(banner, message);
  banner.hidden = false;
}

function clearError(): void {
  document.getElementById("error")!.hidden = true;
}

function signIn(): void {
  following?.stop.abort();
  following = undefined;
  const token = h("input", { type: "password", id: "token", name: "token", autocomplete: "off", required: "", "aria-label": "token" });
  const form = h("form", { class: "signin", "data-testid": "signin" },
    h("h1", {}, "Sign in"),
    h("p", {}, "Your bearer token (the server's --auth-tokens file). It stays in this tab only."),
    token,
    h("button", { type: "submit" }, "Sign in"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, token.value);
    calls = undefined;
    client().then(() => {
      clearError();
      location.hash = "#/threads";
    }, (error) => {
      sessionStorage.removeItem(TOKEN_KEY);
      showError(error);
    });
  });
  fill(main, form);
  token.focus();
}

function statusText(thread: Thread): string {
  const status = thread.status;
  if (status?.type === ThreadStatusType.THREAD_STATUS_TYPE_ACTIVE) {
    const flags = status.activeFlags ?? [];
    if (flags.includes(ThreadActiveFlag.THREAD_ACTIVE_FLAG_WAITING_ON_APPROVAL)) return "waiting on approval";
    if (flags.includes(ThreadActiveFlag.THREAD_ACTIVE_FLAG_WAITING_ON_CLIENT_TOOL)) return "waiting on client tool";
    if (flags.includes(ThreadActiveFlag.THREAD_ACTIVE_FLAG_WAITING_ON_USER_INPUT)) return "waiting on user input";
    if (flags.includes(ThreadActiveFlag.THREAD_ACTIVE_FLAG_PAUSED_AFTER_TOOLS)) return "paused after tools";
    return "running";
  }
  return label(ThreadStatusType, status?.type, "THREAD_STATUS_TYPE_");
}

function runtimeText(runtime: MultiAgentRuntime | undefined): string {
  return !runtime ? "not resolved yet (at the first turn)" : label(MultiAgentRuntime, runtime, "MULTI_AGENT_RUNTIME_");
}

function modeText(mode: MultiAgentMode | undefined): string {
  return mode === undefined ? "unset" : label(MultiAgentMode, mode, "MULTI_AGENT_MODE_");
}

async function threadsPage(query: URLSearchParams): Promise<void> {
  const search = query.get("q") ?? "";
  const archived = query.get("archived") === "1";
  const cursor = query.get("cursor") ?? undefined;
  const api = await client();
  const everyone = isOperator && query.get("all") === "1";
  const page = await api.threadList({ searchTerm: search || undefined, archived, cursor, limit: 25, allPrincipals: everyone || undefined });
  const searchBox = h("input", { type: "search", value: search, placeholder: "search names and previews", "aria-label": "search" });
  const archivedBox = h("input", { type: "checkbox", id: "archived" });
  archivedBox.checked = archived;
  const everyoneBox = h("input", { type: "checkbox", id: "everyone", "data-testid": "all-principals" });
  everyoneBox.checked = everyone;
  const form = h("form", { class: "filters" }, searchBox, h("label", { for: "archived" }, archivedBox, " archived"),
    isOperator ? h("label", { for: "everyone" }, everyoneBox, " every principal (read-only)") : undefined,
    h("button", { type: "submit" }, "Search"));
  const submit = () => {
    const next = new URLSearchParams();
    if (searchBox.value) next.set("q", searchBox.value);
    if (archivedBox.checked) next.set("archived", "1");
    if (everyoneBox.checked) next.set("all", "1");
    location.hash = `#/threads?${next}`;
  };
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    submit();
  });
  everyoneBox.addEventListener("change", submit);
  const rows = (page.data ?? []).map((thread) =>
    h("tr", { "data-thread-id": thread.id },
      h("td", {}, h("a", { href: `#/thread/${thread.id}` }, thread.name || thread.preview || thread.id || "?")),
      everyone ? h("td", { class: "principal" }, thread.principal ?? "") : undefined,
      h("td", {}, statusText(thread)),
      h("td", {}, runtimeText(thread.multiAgentRuntime)),
      h("td", {}, modeText(thread.multiAgentMode)),
      h("td", {}, thread.archived ? "archived" : ""),
      h("td", {}, when(thread.updatedAt))));
  const more = page.nextCursor
    ? h("a", { href: `#/threads?${new URLSearchParams({ ...(search ? { q: search } : {}), ...(archived ? { archived: "1" } : {}),
                                                           ...(everyone ? { all: "1" } : {}), cursor: page.nextCursor })}`, class: "more" }, "Next page")
    : undefined;
  fill(main,
    h("h1", {}, "Threads"),
    form,
    rows.length === 0 ? h("p", { class: "empty" }, "No threads.") :
      h("table", { class: "threads", "data-testid": "threads" },
        h("thead", {}, h("tr", {}, ...["thread", ...(everyone ? ["principal"] : []), "status", "runtime", "selected mode", "", "updated"]
          .map((name) => h("th", {}, name)))),
        h("tbody", {}, ...rows)),
    more);
}

async function rootOf(api: WebSocketClient, thread: Thread): Promise<Thread> {
  let current = thread;
  for (let hops = 0; current.parentThreadId && hops < 32; hops++) {
    current = (await api.threadRead({ threadId: current.parentThreadId })).thread ?? current;
  }
  return current;
}

async function treeOf(api: WebSocketClient, thread: Thread, everyone: boolean): Promise<TreeNode> {
  const children: TreeNode[] = [];
  let cursor: string | undefined;
  do {
    const page = await api.threadList({ parentThreadId: thread.id, limit: 100, cursor, allPrincipals: everyone || undefined });
    for (const child of page.data ?? []) children.push(await treeOf(api, child, everyone));
    cursor = page.nextCursor || undefined;
  } while (cursor !== undefined);
  const source = thread.source;
  const title = source?.agentNickname || source?.taskName || thread.name || "root";
  const detail = [source?.taskName, source?.agentRole].filter(Boolean).join(" · ") || (thread.preview ?? "");
  return { id: thread.id ?? "", title, detail, status: statusText(thread), children };
}

function turnUsage(turn: Turn): number {
  return (turn.modelRequests ?? []).reduce((sum, request) => sum + Number(request.usage?.totalTokens ?? 0n), 0);
}

function renderTurn(turn: Turn, index: number, actions?: (turn: Turn) => HTMLElement | undefined): HTMLElement {
  const items = (turn.items ?? []).map((item) => {
    const type = label(ItemType, item.type, "ITEM_TYPE_");
    const body: Array<Node | string> = [];
    if (item.text) body.push(h("div", { class: "text" }, item.text));
    if (item.toolName) {
      body.push(h("div", { class: "tool" }, h("code", {}, item.toolName), item.status !== undefined ? ` · ${label(ItemStatus, item.status, "ITEM_STATUS_")}` : ""));
      if (item.toolArguments) body.push(h("pre", { class: "arguments" }, item.toolArguments));
      if (item.toolOutput) body.push(h("pre", { class: "output" }, item.toolOutput));
    }
    return h("li", { class: `item item-${type.replaceAll(" ", "-")}` }, h("span", { class: "item-type" }, type), ...body);
  });
  return h("section", { class: `turn${turn.rolledBack ? " rolled-back" : ""}`, "data-turn-id": turn.id, "data-status": label(TurnStatus, turn.status, "TURN_STATUS_") },
    h("h3", {}, `Turn ${index + 1} · ${label(TurnStatus, turn.status, "TURN_STATUS_")}${turn.rolledBack ? " · rolled back" : ""}`,
      h("span", { class: "usage" }, `${turnUsage(turn)} tokens`)),
    turn.error ? h("p", { class: "turn-error" }, turn.error) : undefined,
    actions?.(turn),
    h("ol", { class: "items" }, ...items));
}

/** Branch from a turn, or take it and the later ones back (thread/fork, thread/revert). */
function turnActions(threadId: string, redraw: () => void): (turn: Turn) => HTMLElement | undefined {
  return (turn) => {
    if (turn.status === TurnStatus.TURN_STATUS_IN_PROGRESS && turn.pausedAfterTools && turn.id) {
      // The thread pauses after tools: the tools' results are above; the model goes on when asked.
      const go = h("button", { type: "button", "data-testid": "continue-turn" }, "Continue");
      go.addEventListener("click", () => {
        void client().then((api) => api.turnContinue({ threadId, turnId: turn.id! })).then(() => redraw(), showError);
      });
      return h("div", { class: "turn-actions" }, go);
    }
    if (turn.rolledBack || turn.status === TurnStatus.TURN_STATUS_IN_PROGRESS || !turn.id) return undefined;
    const fork = h("button", { type: "button", "data-testid": "fork-here" }, "Fork after this turn");
    fork.addEventListener("click", () => {
      void client().then((api) => api.threadFork({ threadId, excludeTurns: true, position: { case: "atTurnId", value: turn.id! } }))
        .then((forked) => (location.hash = `#/thread/${forked.thread?.id}`), showError);
    });
    const revert = h("button", { type: "button", "data-testid": "revert-here" }, "Revert from this turn");
    revert.addEventListener("click", () => {
      if (!confirm("Take this turn and every later one out of the model's context?")) return;
      void client().then((api) => api.threadRevert({ threadId, boundary: { case: "beforeTurnId", value: turn.id! } }))
        .then(() => redraw(), showError);
    });
    return h("div", { class: "turn-actions" }, fork, revert);
  };
}

function settingsForm(api: WebSocketClient, thread: Thread, settings: ThreadSettings | undefined, efforts: string[],
                      reload: () => void): HTMLElement {
  const policy = settings?.approvalPolicy;
  const mode = h("select", { "aria-label": "multi-agent mode", "data-testid": "mode" },
    h("option", { value: "unset" }, "unset (the server's default)"),
    h("option", { value: "explicit" }, "explicit request only"),
    h("option", { value: "proactive" }, "proactive"));
  mode.value = thread.multiAgentMode === MultiAgentMode.MULTI_AGENT_MODE_PROACTIVE ? "proactive"
    : thread.multiAgentMode === MultiAgentMode.MULTI_AGENT_MODE_EXPLICIT_REQUEST_ONLY ? "explicit" : "unset";
  const approval = h("select", { "aria-label": "approval policy" },
    ...[ApprovalPolicy.APPROVAL_POLICY_NEVER, ApprovalPolicy.APPROVAL_POLICY_ON_REQUEST, ApprovalPolicy.APPROVAL_POLICY_ALWAYS]
      .map((value) => h("option", { value: String(value) }, label(ApprovalPolicy, value, "APPROVAL_POLICY_"))));
  approval.value = String(policy ?? ApprovalPolicy.APPROVAL_POLICY_NEVER);
  const model = h("input", { type: "text", value: thread.model ?? "", "aria-label": "model" });
  const effort = h("select", { "aria-label": "reasoning effort", "data-testid": "effort" },
    h("option", { value: "" }, "provider's default"), ...efforts.map((name) => h("option", { value: name }, name)));
  effort.value = settings?.reasoningEffort ?? "";
  const pause = h("input", { type: "checkbox", "aria-label": "pause after tools", "data-testid": "pause-after-tools" });
  pause.checked = settings?.pauseAfterTools === true;
  const save = h("button", { type: "submit" }, "Save settings");
  const form = h("form", { class: "settings" },
    h("label", {}, "mode ", mode), h("label", {}, "approvals ", approval), h("label", {}, "model ", model),
    h("label", {}, "reasoning ", effort), h("label", {}, pause, " pause after tools"), save);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const update = mode.value === "unset"
      ? { case: "clearMultiAgentMode" as const, value: true }
      : { case: "multiAgentMode" as const, value: mode.value === "proactive" ? MultiAgentMode.MULTI_AGENT_MODE_PROACTIVE : MultiAgentMode.MULTI_AGENT_MODE_EXPLICIT_REQUEST_ONLY };
    api.threadSettingsUpdate({
      threadId: thread.id, multiAgentModeUpdate: update, approvalPolicy: Number(approval.value) as ApprovalPolicy,
      model: model.value && model.value !== thread.model ? model.value : undefined,
      reasoningEffort: effort.value !== (settings?.reasoningEffort ?? "") ? effort.value : undefined,
      pauseAfterTools: pause.checked !== (settings?.pauseAfterTools === true) ? pause.checked : undefined,
    }).then(() => reload(), showError);
  });
  return form;
}

async function threadPage(threadId: string): Promise<void> {
  const api = await client();
  const read = await api.threadRead({ threadId, includeTurns: true, includeModelRequests: true });
  const thread = read.thread!;
  const root = await rootOf(api, thread);
  // An operator looking at another principal's thread reads it and changes
  // nothing (the server refuses anything else): no settings, no live view.
  const readOnly = thread.principal !== undefined && thread.principal !== principal;
  const resumed = readOnly
    ? { multiAgentRuntime: thread.multiAgentRuntime, multiAgentMode: thread.multiAgentMode, model: read.settings?.model,
        approvalPolicy: read.settings?.approvalPolicy, settings: read.settings }
    : await api.threadResume({ threadId, excludeTurns: true });
  const catalog = readOnly ? undefined : await api.modelList({});
  const efforts = catalog?.models?.find((entry) => entry.slug === (resumed.model ?? thread.model))?.reasoningEfforts ?? [];
  if (!readOnly) await api.threadUnsubscribe({ threadId }); // the calls' connection does not follow; the live one does
  const live = h("div", { class: "live", "data-testid": "live", "data-deltas": "0" });
  const treeHolder = h("div", { class: "tree-holder" });
  const turnsHolder = h("div", { class: "turns" });
  const chartHolder = h("div", { class: "chart-holder" });
  // Redraws ask client() each time: after a dropped connection it dials again.
  const drawTree = async () => {
    fill(treeHolder, agentTree(await treeOf(await client(), root, readOnly), (id) => (location.hash = `#/thread/${id}`), threadId));
  };
  const drawTurns = async () => {
    const fresh = (await (await client()).threadRead({ threadId, includeTurns: true, includeModelRequests: true, includeRolledBack: true })).thread!;
    const turns = fresh.turns ?? [];
    const actions = readOnly ? undefined : turnActions(threadId, () => void drawTurns().catch(showError));
    fill(turnsHolder, ...turns.map((turn, index) => renderTurn(turn, index, actions)).reverse());
    fill(chartHolder, turns.length === 0 ? h("p", { class: "empty" }, "No turns yet.")
      : barChart(turns.map((turn, index) => ({ label: String(index + 1), value: turnUsage(turn) })), "tokens per turn"));
    fill(document.getElementById("thread-status")!, statusText(fresh));
    fill(document.getElementById("thread-runtime")!, runtimeText(fresh.multiAgentRuntime));
  };
  fill(main,
    h("h1", {}, thread.name || thread.preview || "Thread", " ", h("small", {}, thread.id)),
    h("dl", { class: "facts" },
      h("dt", {}, "status"), h("dd", { id: "thread-status" }, statusText(thread)),
      h("dt", {}, "runtime"), h("dd", { "data-testid": "runtime", id: "thread-runtime" }, runtimeText(resumed.multiAgentRuntime ?? thread.multiAgentRuntime)),
      h("dt", {}, "selected mode"), h("dd", { "data-testid": "selected-mode" }, modeText(resumed.multiAgentMode)),
      h("dt", {}, "model"), h("dd", {}, resumed.model ?? thread.model ?? "—"),
      h("dt", {}, "created"), h("dd", {}, when(thread.createdAt)),
      thread.forkedFromId ? h("dt", {}, "forked from") : undefined,
      thread.forkedFromId ? h("dd", {}, h("a", { href: `#/thread/${thread.forkedFromId}` }, thread.forkedFromId)) : undefined,
      thread.parentThreadId ? h("dt", {}, "parent") : undefined,
      thread.parentThreadId ? h("dd", {}, h("a", { href: `#/thread/${thread.parentThreadId}` }, thread.parentThreadId)) : undefined),
    readOnly ? h("p", { class: "read-only", "data-testid": "read-only" }, `${thread.principal}'s thread: read-only for an operator`)
      : settingsForm(api, thread, resumed.settings, efforts, () => void threadPage(threadId)),
    h("h2", {}, "Agent tree"), treeHolder,
    h("h2", {}, "Tokens per turn"), chartHolder,
    h("h2", {}, "Live"), live,
    h("h2", {}, "Turns"), turnsHolder);
  // Listening before the first draw: an event between that draw's read and
  // this handler would otherwise be missed until the next one (the status,
  // say, redrawn with turns drawn before it). Bursts of notifications
  // redraw once; what any of them asked for is redrawn.
  let redraw: ReturnType<typeof setTimeout> | undefined;
  let wanted = { turns: false, tree: false };
  const later = (turns: boolean) => {
    wanted = { turns: wanted.turns || turns, tree: true };
    clearTimeout(redraw);
    redraw = setTimeout(() => {
      const work = wanted;
      wanted = { turns: false, tree: false };
      void (async () => {
        if (work.turns) await drawTurns();
        if (work.tree) await drawTree();
      })().catch(showError);
    }, 150);
  };
  onNotification = (note) => {
    const about = notificationThreadId(note);
    const payload = note.payload;
    if (payload?.case === "itemAgentMessageDelta" && about === threadId) {
      live.append(payload.value.delta ?? "");
      live.dataset.deltas = String(Number(live.dataset.deltas) + 1);
      return;
    }
    if (about === threadId && (payload?.case === "itemCompleted" || payload?.case === "turnCompleted" || payload?.case === "turnStarted"
        || payload?.case === "threadStatusChanged")) {
      if (payload.case === "turnStarted") fill(live);
      later(true);
    } else if (payload?.case === "threadStarted" || payload?.case === "threadStatusChanged" || payload?.case === "turnCompleted") {
      later(false);
    }
  };
  if (readOnly) {
    following?.stop.abort();
    following = undefined;
  } else {
    follow(root.id ?? threadId);
  }
  await Promise.all([drawTree(), drawTurns()]);
}

async function serverPage(): Promise<void> {
  const api = await client();
  const info = api.serverInfo;
  const [servers, models] = await Promise.all([api.mcpServerList({}), api.modelList({})]);
  const limits = Object.entries(info?.limits ?? {}).map(([name, value]) => h("tr", {}, h("td", {}, name), h("td", {}, String(value))));
  fill(main,
    h("h1", {}, "Server"),
    h("dl", { class: "facts" },
      h("dt", {}, "server"), h("dd", {}, `${info?.serverInfo?.name ?? "?"} ${info?.serverInfo?.version ?? ""}`),
      h("dt", {}, "principal"), h("dd", {}, `${principal ?? "?"}${isOperator ? " (operator)" : ""}`),
      h("dt", {}, "protocol"), h("dd", {}, String(info?.protocolVersion ?? "?"))),
    h("h2", {}, "MCP servers"),
    (servers.servers ?? []).length === 0 ? h("p", { class: "empty" }, "None configured.") :
      h("table", { class: "threads", "data-testid": "mcp-servers" },
        h("thead", {}, h("tr", {}, ...["name", "state", "restarts", "tools", "last error"].map((name) => h("th", {}, name)))),
        h("tbody", {}, ...(servers.servers ?? []).map((server) => h("tr", {},
          h("td", {}, server.name ?? ""), h("td", {}, label(McpServerState, server.state, "MCP_SERVER_STATE_")),
          h("td", {}, String(server.restarts ?? 0)), h("td", {}, (server.tools ?? []).map((tool) => tool.name).join(", ")),
          h("td", {}, server.lastError ?? ""))))),
    h("h2", {}, "Models"),
    h("table", { class: "threads", "data-testid": "models" },
      h("thead", {}, h("tr", {}, ...["model", "provider", "context window", "runtime"].map((name) => h("th", {}, name)))),
      h("tbody", {}, ...(models.models ?? []).map((model) => h("tr", {},
        h("td", {}, model.slug ?? ""), h("td", {}, model.provider ?? ""), h("td", {}, String(model.contextWindow ?? "—")),
        h("td", {}, model.multiAgentVersion ?? ""))))),
    h("h2", {}, "Limits"),
    h("table", { class: "threads" }, h("tbody", {}, ...limits)));
}

// ---- cluster and health (operators): instances, leases, requests ----

/** The open cluster page's poll; stopped when the page changes. */
let clusterPoll: ReturnType<typeof setInterval> | undefined;

async function clusterPage(): Promise<void> {
  const facts = h("dl", { class: "facts" });
  const instances = h("div");
  const leases = h("div");
  const load = h("div", { class: "chart-holder" });
  const methods = h("div");
  const mcp = h("div");
  fill(main, h("h1", {}, "Cluster"), facts,
    h("h2", {}, "Instances"), instances, h("h2", {}, "Agent-tree leases"), leases,
    h("h2", {}, "Requests on this instance"), load, methods, h("h2", {}, "MCP servers"), mcp);
  // Request rate from the change of the counters between polls, the last minute of them.
  const rates: Array<{ label: string; value: number }> = [];
  let last: { at: number; total: number } | undefined;
  const draw = (status: ClusterStatusResult) => {
    const total = (status.methods ?? []).reduce((sum, m) => sum + Number(m.requests ?? 0), 0);
    const now = Date.now();
    if (last && now > last.at) {
      rates.push({ label: new Date(now).toLocaleTimeString([], { minute: "2-digit", second: "2-digit" }),
                   value: Math.round((total - last.total) * 1000 / (now - last.at)) });
      if (rates.length > 30) rates.shift();
    }
    last = { at: now, total };
    fill(facts,
      h("dt", {}, "this instance"), h("dd", { "data-testid": "instance-id" }, status.instanceId ?? "the only one"),
      h("dt", {}, "version"), h("dd", {}, status.version ?? "?"),
      h("dt", {}, "store"), h("dd", {}, status.sharedStore ? "shared by several instances (PostgreSQL)" : "this instance's alone"),
      h("dt", {}, "state"), h("dd", {}, status.draining ? "draining" : "serving"));
    fill(instances, h("table", { class: "threads", "data-testid": "instances" },
      h("thead", {}, h("tr", {}, ...["address", "instance", "live leases", ""].map((name) => h("th", {}, name)))),
      h("tbody", {}, ...(status.instances ?? []).map((instance) => h("tr", {},
        h("td", {}, instance.address ?? "—"), h("td", {}, instance.instanceId ?? "—"), h("td", {}, String(instance.liveLeases ?? 0)),
        h("td", {}, instance.thisInstance ? "this one" : ""))))));
    fill(leases, (status.leases ?? []).length === 0
      ? h("p", { class: "empty" }, status.sharedStore ? "No tree is leased now." : "One instance: its trees need no leases.")
      : h("table", { class: "threads", "data-testid": "leases" },
        h("thead", {}, h("tr", {}, ...["tree", "holder", "epoch", "expires in"].map((name) => h("th", {}, name)))),
        h("tbody", {}, ...(status.leases ?? []).map((lease) => h("tr", {},
          h("td", {}, h("a", { href: `#/thread/${lease.tree}` }, lease.tree ?? "")), h("td", {}, lease.address ?? ""),
          h("td", {}, String(lease.epoch ?? 0)), h("td", {}, `${((Number(lease.expiresInMs ?? 0)) / 1000).toFixed(1)} s`))))));
    const figure = (chart: SVGElement, caption: string) => h("figure", { class: "small-chart" }, chart, h("figcaption", {}, caption));
    fill(load,
      figure(barChart(rates, "requests per second"), "requests per second (every 2 s)"),
      figure(barChart((status.methods ?? []).filter((m) => m.p99Ms !== undefined)
        .map((m) => ({ label: m.method ?? "", value: Math.round(Number(m.p99Ms) * 100) / 100 })), "p99 ms by method"), "p99 by method (ms)"));
    fill(methods, h("table", { class: "threads", "data-testid": "methods" },
      h("thead", {}, h("tr", {}, ...["method", "requests", "p99"].map((name) => h("th", {}, name)))),
      h("tbody", {}, ...(status.methods ?? []).map((m) => h("tr", {},
        h("td", {}, m.method ?? ""), h("td", {}, String(m.requests ?? 0)),
        h("td", {}, m.p99Ms === undefined ? "over 10 s" : `≤ ${Number(m.p99Ms)} ms`))))));
  };
  const poll = async () => {
    const [status, servers] = await Promise.all([(await client()).clusterStatus({}), (await client()).mcpServerList({})]);
    draw(status);
    fill(mcp, (servers.servers ?? []).length === 0 ? h("p", { class: "empty" }, "None configured.") :
      h("table", { class: "threads" },
        h("thead", {}, h("tr", {}, ...["name", "state", "restarts", "last error"].map((name) => h("th", {}, name)))),
        h("tbody", {}, ...(servers.servers ?? []).map((server) => h("tr", {},
          h("td", {}, server.name ?? ""), h("td", {}, label(McpServerState, server.state, "MCP_SERVER_STATE_")),
          h("td", {}, String(server.restarts ?? 0)), h("td", {}, server.lastError ?? ""))))));
  };
  await poll();
  clusterPoll = setInterval(() => void poll().catch(showError), 2000);
}

async function route(): Promise<void> {
  clearError();
  clearInterval(clusterPoll);
  clusterPoll = undefined;
  const [path, queryText] = location.hash.replace(/^#/, "").split("?");
  const query = new URLSearchParams(queryText ?? "");
  if (!sessionStorage.getItem(TOKEN_KEY) && path !== "/signin") {
    // A server without authentication takes an empty token: try it once.
    try {
      await client();
    } catch {
      location.hash = "#/signin";
      return;
    }
  }
  try {
    if (path === "/signin") return signIn();
    const thread = path.match(/^\/thread\/([^/]+)$/);
    if (thread) return await threadPage(decodeURIComponent(thread[1]));
    if (path === "/server") {
      following?.stop.abort();
      following = undefined;
      return await serverPage();
    }
    if (path === "/cluster") {
      following?.stop.abort();
      following = undefined;
      return await clusterPage();
    }
    following?.stop.abort();
    following = undefined;
    return await threadsPage(query);
  } catch (error) {
    if (error instanceof StatusError && error.code === Code.UNAUTHENTICATED) {
      sessionStorage.removeItem(TOKEN_KEY);
      calls = undefined;
      location.hash = "#/signin";
    }
    showError(error);
  }
}

document.getElementById("signout")!.addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  void calls?.close();
  calls = undefined;
  fill(who, "");
  location.hash = "#/signin";
});
window.addEventListener("hashchange", () => void route());
void route();
