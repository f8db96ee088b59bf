import Foundation
import Testing
@testable import ThreadwireCore

@Suite("typed collaboration tools: schemas and argument validation")
struct ToolArgumentTests {
    @Test("every offered tool carries an object schema whose properties are exactly its parameters")
    func schemas() throws {
        for runtime in [MultiAgentRuntime.v1, .v2] {
            for spec in ToolCatalog.offered(runtime: runtime, depth: 0, maxDepth: 1, source: .appServer) {
                let schema = try #require(try JSONSerialization.jsonObject(with: Data(spec.parametersSchema.utf8)) as? [String: Any])
                #expect(schema["type"] as? String == "object")
                #expect(schema["additionalProperties"] as? Bool == false)
                let properties = try #require(schema["properties"] as? [String: Any])
                let definition = try #require(ToolCatalog.definition(spec.name, runtime: runtime))
                #expect(Set(properties.keys) == Set(definition.parameters.map(\.name)), "\(runtime) \(spec.name)")
                #expect(Set(schema["required"] as? [String] ?? []) == Set(definition.parameters.filter(\.required).map(\.name)))
            }
        }
    }

    @Test("malformed arguments get a message naming what is wrong; valid ones decode")
    func validation() throws {
        let spawn = try #require(ToolCatalog.definition("spawn_agent", runtime: .v2))
        func failure(_ arguments: String) -> String {
            do {
                _ = try spawn.decode(arguments, as: ToolArguments.Spawn.self)
                return "(decoded)"
            } catch {
                return "\(error)"
            }
        }
        #expect(failure("not json").contains("must be a JSON object"))
        #expect(failure("[1]").contains("must be a JSON object"))
        #expect(failure(#"{"message": "m"}"#).contains("needs the argument 'task_name'"))
        #expect(failure(#"{"task_name": 3, "message": "m"}"#).contains("argument 'task_name' of spawn_agent must be a string"))
        #expect(failure(#"{"task_name": "t", "message": "m", "colour": "red"}"#).contains("has no argument 'colour'"))
        let decoded = try spawn.decode(#"{"task_name": "t", "message": "m", "model": null}"#, as: ToolArguments.Spawn.self)
        #expect(decoded.task_name == "t" && decoded.message == "m" && decoded.model == nil)

        let wait = try #require(ToolCatalog.definition("wait_agent", runtime: .v2))
        #expect(throws: ToolArgumentError.self) { try wait.decode(#"{"timeout_ms": -5}"#, as: ToolArguments.Wait.self) }
        #expect(throws: ToolArgumentError.self) { try wait.decode(#"{"timeout_ms": true}"#, as: ToolArguments.Wait.self) }
        #expect(throws: ToolArgumentError.self) { try wait.decode(#"{"targets": ["a", 1]}"#, as: ToolArguments.Wait.self) }
        #expect(try wait.decode(#"{"targets": ["a"], "timeout_ms": 10}"#, as: ToolArguments.Wait.self).timeout_ms == 10)
        #expect(try wait.decode("", as: ToolArguments.Wait.self).targets == nil, "no arguments at all is an empty object")
    }
}
