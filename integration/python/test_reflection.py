"""reflection/descriptors: the server's compiled proto/, before initialize,
and Client.call_dict driving the API from it alone."""
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool

from threadwire_client import Client, StatusError, messages


def test_descriptors_before_initialize_describe_the_whole_contract(server):
    host, port = server
    with Client(host, port) as client:
        result = client.call("reflection/descriptors")  # no initialize first
        files = descriptor_pb2.FileDescriptorSet.FromString(result.file_descriptor_set)
        names = [f.name for f in files.file]
        assert "threadwire/v1/envelope.proto" in names and "threadwire/v1/reflection.proto" in names
        # Dependency order: a pool accepts the files one by one.
        pool = descriptor_pool.DescriptorPool()
        for file in files.file:
            pool.Add(file)
        assert result.envelope_type == "threadwire.v1.Envelope"
        assert result.protocol_version == 1
        request = pool.FindMessageTypeByName("threadwire.v1.Request")
        params_fields = {f.name: f.message_type.full_name for f in request.oneofs_by_name["params"].fields}
        # Exactly the methods of the Request oneof, each with its types, and the
        # same set this package was generated with.
        assert {m.field: m.params_type for m in result.methods} == params_fields
        assert set(params_fields) == {f.name for f in messages.envelope.Request.DESCRIPTOR.oneofs_by_name["params"].fields}
        by_name = {m.name: m for m in result.methods}
        assert by_name["thread/settings/update"].field == "thread_settings_update"
        assert by_name["mcp_server/list"].field == "mcp_server_list"
        assert by_name["thread/start"].result_type == "threadwire.v1.ThreadLifecycleResult"
        notes = {m.name: m.field for m in result.notifications}
        assert notes["item/agent_message/delta"] == "item_agent_message_delta"
        assert notes["thread/rolled_back"] == "thread_rolled_back"
        assert all(not m.result_type for m in result.notifications)
        assert {m.name for m in result.server_requests} == {
            "item/tool/call", "item/tool/request_approval", "item/tool/request_user_input"}


def test_call_dict_uses_only_the_reflected_schema(server):
    host, port = server
    with Client(host, port) as client:
        assert client.schema().protocol_version == 1
        client.call_dict("initialize", {"client_info": {"name": "reflecting"}, "protocol_version": 1})
        started = client.call_dict("thread/start", {"multi_agent_mode": "MULTI_AGENT_MODE_PROACTIVE"})
        thread_id = started["thread"]["id"]
        assert started["multi_agent_mode"] == "MULTI_AGENT_MODE_PROACTIVE"
        updated = client.call_dict("thread/settings/update", {"thread_id": thread_id, "clear_multi_agent_mode": True})
        assert "multi_agent_mode" not in updated["settings"]
        read = client.call_dict("thread/read", {"thread_id": thread_id})
        assert read["thread"]["id"] == thread_id
        # A turn's notifications read back through the reflected schema too.
        client.call_dict("turn/start", {"thread_id": thread_id, "input": [{"text": "hello"}]})
        methods = []
        for note in client.iter_notifications():
            method, params = client.schema().notification_to_dict(note)
            methods.append(method)
            if method == "turn/completed":
                assert params["turn"]["status"] == "TURN_STATUS_COMPLETED"
                break
        assert "turn/started" in methods and "item/completed" in methods
        with pytest.raises(StatusError) as missing:
            client.call_dict("thread/read", {"thread_id": "no-such-thread"})
        assert missing.value.code == 5 and "no-such-thread" in missing.value.message
        with pytest.raises(ValueError, match="no method 'thread/explode'"):
            client.call_dict("thread/explode", {})
