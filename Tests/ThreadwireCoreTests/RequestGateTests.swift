import Testing
import ThreadwireCore

@Suite("per-principal request rate (no I/O)")
struct RequestGateTests {
    private func send(_ count: Int, through gates: [RequestGate], as principal: Principal) async -> (admitted: Int, refusals: [String]) {
        var admitted = 0
        var refusals: [String] = []
        for index in 0..<count {
            let gate = gates[index % gates.count]
            var refusal: DomainError?
            switch gate.admit(principal) {
            case .admitted: break
            case let .refused(error): refusal = error
            case .wait: refusal = await gate.admitAfterClaim(principal)
            }
            if let refusal { refusals.append(refusal.description) } else { admitted += 1 }
        }
        return (admitted, refusals)
    }

    @Test("alone, a burst of N then nothing until refilled; each principal has its own bucket")
    func alone() async {
        let gate = RequestGate(limits: PrincipalLimits(maxRequestsPerSecond: 1, requestBurst: 10), ledger: nil)
        let began = ContinuousClock.now
        let alice = await send(30, through: [gate], as: "alice")
        let refilled = Int((ContinuousClock.now - began).components.seconds)
        #expect(alice.admitted >= 10 && alice.admitted <= 10 + refilled)
        #expect(alice.refusals.allSatisfy { $0.contains("max_requests_per_second (1 per second, bursts of 10)") && $0.contains("retry in") })
        #expect(await send(10, through: [gate], as: "bob").admitted == 10)
    }

    @Test("gates of three instances sharing one ledger admit the ledger's budget between them, not three budgets; a request finding no tokens waits for a claim instead of being refused")
    func sharedLedger() async {
        let ledger = LocalQuotaLedger()
        let limits = PrincipalLimits(maxRequestsPerSecond: 1, requestBurst: 10)
        let gates = (0..<3).map { _ in RequestGate(limits: limits, ledger: ledger) }
        let began = ContinuousClock.now
        let alice = await send(60, through: gates, as: "alice")
        let refilled = Int((ContinuousClock.now - began).components.seconds)
        // Each gate may hold one claimed token unspent.
        #expect(alice.admitted >= 10 - 3 && alice.admitted <= 10 + refilled, "admitted \(alice.admitted)")
        // The first request through each gate found no token there and was admitted after its claim.
        let fresh = RequestGate(limits: limits, ledger: ledger)
        let first = fresh.admit("carol")
        #expect({ if case .wait = first { true } else { false } }(), "a gate sharing a ledger holds no tokens before its first claim: \(first)")
        #expect(await fresh.admitAfterClaim("carol") == nil)
    }
}
