package ctxfold_test

// The language-neutral conformance suite (clients/conformance, format in clients/README.md): every
// scenario file is one test, run against a real `ctxfold serve`.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/ctxfold/ctxfold/clients/go/ctxfold"
	"github.com/ctxfold/ctxfold/clients/go/ctxfold/anthropic"
	"github.com/ctxfold/ctxfold/clients/go/ctxfold/openaichat"
	"github.com/ctxfold/ctxfold/clients/go/ctxfold/openairesponses"
	"github.com/ctxfold/ctxfold/clients/go/ctxfoldv1"
	"github.com/ctxfold/ctxfold/clients/go/internal/testserver"
)

const conformanceDir = "../../conformance"

type scenario struct {
	Name   string         `json:"name"`
	Config map[string]any `json:"config"`
	Steps  []step         `json:"steps"`
}

type step struct {
	Op     string         `json:"op"`
	Args   map[string]any `json:"args"`
	Save   string         `json:"save"`
	Expect map[string]any `json:"expect"`
	Error  *struct {
		Code   string `json:"code"`
		Reason string `json:"reason"`
		Domain string `json:"domain"`
	} `json:"error"`
	Repeat int `json:"repeat"`
	// RawArgs are the args as written: Go maps lose the key order that tool schemas keep.
	RawArgs map[string]json.RawMessage `json:"-"`
}

func (s *step) UnmarshalJSON(data []byte) error {
	type fields step
	var wire struct {
		fields
		Args json.RawMessage `json:"args"`
	}
	if err := json.Unmarshal(data, &wire); err != nil {
		return err
	}
	*s = step(wire.fields)
	if len(wire.Args) == 0 {
		return nil
	}
	if err := json.Unmarshal(wire.Args, &s.Args); err != nil {
		return err
	}
	return json.Unmarshal(wire.Args, &s.RawArgs)
}

func TestConformance(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(conformanceDir, "scenarios", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no conformance scenarios in %s (%v)", conformanceDir, err)
	}
	srv := testserver.Start(t, testserver.Options{})
	client := dial(t, srv.Addr)
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".json")
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			var sc scenario
			if err := json.Unmarshal(data, &sc); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			err = (&runner{client: client, saved: map[string]any{}}).run(context.Background(), sc)
			if err != nil {
				t.Fatalf("%s: %v", sc.Name, err)
			}
		})
	}
}

type runner struct {
	client *ctxfold.Client
	saved  map[string]any
}

func (r *runner) run(ctx context.Context, sc scenario) error {
	if sc.Config != nil {
		session, err := r.call(ctx, "create_session", map[string]any{"config": sc.Config}, nil)
		if err != nil {
			return fmt.Errorf("create the scenario's session: %w", err)
		}
		r.saved["session"] = session
	}
	for i, st := range sc.Steps {
		for range max(st.Repeat, 1) {
			if err := r.step(ctx, st); err != nil {
				return fmt.Errorf("step %d (%s): %w", i+1, st.Op, err)
			}
		}
	}
	return nil
}

func (r *runner) step(ctx context.Context, st step) error {
	args, err := r.substitute(st.Args)
	if err != nil {
		return err
	}
	argMap, _ := args.(map[string]any)
	if argMap == nil {
		argMap = map[string]any{}
	}
	result, err := r.call(ctx, st.Op, argMap, st.RawArgs)
	if st.Error != nil {
		var e *ctxfold.Error
		if !errors.As(err, &e) {
			return fmt.Errorf("want error %s %s, got %v (result %v)", st.Error.Code, st.Error.Reason, err, result)
		}
		if ctxfold.CodeName(e.Code) != st.Error.Code || e.Reason.String() != st.Error.Reason ||
			(st.Error.Domain != "" && e.Domain != st.Error.Domain) {
			return fmt.Errorf("want error %s %s %s, got %v (domain %q)", st.Error.Code, st.Error.Reason, st.Error.Domain, e, e.Domain)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if st.Save != "" {
		r.saved[st.Save] = result
	}
	for path, matcher := range st.Expect {
		got, found := lookup(result, path)
		if err := r.match(path, got, found, matcher); err != nil {
			return err
		}
	}
	return nil
}

// substitute replaces "$name.path" strings and the generated values {"$repeat"}, {"$json"}.
func (r *runner) substitute(value any) (any, error) {
	switch v := value.(type) {
	case string:
		if !strings.HasPrefix(v, "$") {
			return v, nil
		}
		name, path, _ := strings.Cut(v[1:], ".")
		root, ok := r.saved[name]
		if !ok {
			return nil, fmt.Errorf("nothing saved as %q", name)
		}
		if path == "" {
			return root, nil
		}
		got, ok := lookup(root, path)
		if !ok {
			return nil, fmt.Errorf("%s: no such path in the saved result", v)
		}
		return got, nil
	case map[string]any:
		if text, ok := v["$repeat"].(string); ok {
			return strings.Repeat(text, int(v["times"].(float64))), nil
		}
		if format, ok := v["$tool_definitions"].(string); ok {
			return ctxfold.ToolDefinitions(ctxfold.ToolFormat(format))
		}
		if inner, ok := v["$json"]; ok {
			resolved, err := r.substitute(inner)
			if err != nil {
				return nil, err
			}
			data, err := json.Marshal(resolved)
			return string(data), err
		}
		out := map[string]any{}
		for k, item := range v {
			resolved, err := r.substitute(item)
			if err != nil {
				return nil, err
			}
			out[k] = resolved
		}
		return out, nil
	case []any:
		out := make([]any, len(v))
		for i, item := range v {
			resolved, err := r.substitute(item)
			if err != nil {
				return nil, err
			}
			out[i] = resolved
		}
		return out, nil
	}
	return value, nil
}

func (r *runner) match(path string, got any, found bool, matcher any) error {
	if m, ok := matcher.(map[string]any); ok && len(m) == 1 {
		for kind, operand := range m {
			switch kind {
			case "present":
				present := found && !isDefault(got)
				if present != operand.(bool) {
					return fmt.Errorf("%s: present = %v, want %v (value %v)", path, present, operand, got)
				}
				return nil
			case "contains":
				if s, ok := got.(string); !ok || !strings.Contains(s, operand.(string)) {
					return fmt.Errorf("%s = %.200q, does not contain %q", path, got, operand)
				}
				return nil
			case "matches":
				if s, ok := got.(string); !ok || !regexp.MustCompile(operand.(string)).MatchString(s) {
					return fmt.Errorf("%s = %.200q, does not match %s", path, got, operand)
				}
				return nil
			case "gte", "lte":
				n, ok := got.(float64)
				if !ok || (kind == "gte" && n < operand.(float64)) || (kind == "lte" && n > operand.(float64)) {
					return fmt.Errorf("%s = %v, want %s %v", path, got, kind, operand)
				}
				return nil
			case "equals_saved":
				want, err := r.substitute(operand)
				if err != nil {
					return err
				}
				if !reflect.DeepEqual(got, want) {
					return fmt.Errorf("%s = %v, want %v (%s)", path, got, want, operand)
				}
				return nil
			}
		}
	}
	if !found || !reflect.DeepEqual(got, matcher) {
		return fmt.Errorf("%s = %.300v (found %v), want %v", path, got, found, matcher)
	}
	return nil
}

// isDefault reports whether a JSON value is its type's default: null, "", 0, false or empty.
func isDefault(value any) bool {
	switch v := value.(type) {
	case nil:
		return true
	case []any:
		return len(v) == 0
	case map[string]any:
		return len(v) == 0
	}
	return value == "" || value == float64(0) || value == false
}

// lookup follows a dot-separated path of keys, list indexes and "length".
func lookup(value any, path string) (any, bool) {
	for part := range strings.SplitSeq(path, ".") {
		switch v := value.(type) {
		case map[string]any:
			next, ok := v[part]
			if !ok {
				return nil, false
			}
			value = next
		case []any:
			if part == "length" {
				value = float64(len(v))
				continue
			}
			i, err := strconv.Atoi(part)
			if err != nil || i < 0 || i >= len(v) {
				return nil, false
			}
			value = v[i]
		case string:
			if part != "length" {
				return nil, false
			}
			value = float64(len(v))
		default:
			return nil, false
		}
	}
	return value, true
}

// call runs one operation and returns its result in canonical JSON form (raw: the args as written).
func (r *runner) call(ctx context.Context, op string, args map[string]any, raw map[string]json.RawMessage) (any, error) {
	target, ok := args["session"]
	if !ok {
		target = r.saved["session"]
	}
	session := r.client.OpenSession(sessionID(target))
	str := func(key string) string { s, _ := args[key].(string); return s }
	num := func(key string) int64 { n, _ := args[key].(float64); return int64(n) }
	flag := func(key string) bool { b, _ := args[key].(bool); return b }
	pageSize := ctxfold.PageSize(int32(num("page_size")))
	switch op {
	case "create_session":
		options, err := configOptions(args["config"])
		if err != nil {
			return nil, err
		}
		if tools, ok := toolsArg(args, raw); ok {
			options = append(options, ctxfold.Tools(tools))
		}
		cfg, err := ctxfold.NewSessionConfig(0, options...)
		if err != nil {
			return nil, err
		}
		s, err := r.client.CreateSession(ctx, cfg)
		if err != nil {
			return nil, err
		}
		return canonical(s.Info().Proto()), nil
	case "get_session":
		s, err := r.client.GetSession(ctx, session.ID())
		if err != nil {
			return nil, err
		}
		return canonical(s.Info().Proto()), nil
	case "list_sessions":
		return collect("sessions", r.client.Sessions(ctx, pageSize), ctxfold.SessionInfo.Proto)
	case "delete_session":
		return map[string]any{}, session.Delete(ctx)
	case "append_messages":
		msgs, err := messagesArg(args["messages"])
		if err != nil {
			return nil, err
		}
		appended, err := session.AppendWithRequestID(ctx, str("request_id"), msgs...)
		if err != nil {
			return nil, err
		}
		return map[string]any{"messages": canonicalList(appended, ctxfold.Message.Proto)}, nil
	case "list_messages":
		opts := []ctxfold.ListOption{pageSize}
		if flag("include_abandoned") {
			opts = append(opts, ctxfold.IncludeAbandoned())
		}
		return collect("messages", session.Messages(ctx, opts...), ctxfold.Message.Proto)
	case "prepare", "prepare_events":
		msgs, err := messagesArg(args["append"])
		if err != nil {
			return nil, err
		}
		opts := []ctxfold.PrepareOption{ctxfold.WithAppend(msgs...), ctxfold.WithRequestID(str("request_id"))}
		if flag("overflow") {
			opts = append(opts, ctxfold.WithOverflow())
		}
		if op == "prepare" {
			return viewResult(session.Prepare(ctx, opts...))
		}
		return eventsResult(session.PrepareEvents(ctx, opts...))
	case "compact", "compact_events":
		opts := []ctxfold.CompactOption{ctxfold.Focus(str("focus")), ctxfold.KeepTokens(num("keep_tokens"))}
		if flag("dry_run") {
			opts = append(opts, ctxfold.DryRun())
		}
		if op == "compact" {
			return viewResult(session.Compact(ctx, opts...))
		}
		return eventsResult(session.CompactEvents(ctx, opts...))
	case "observe_usage":
		var version int64
		switch view := args["view"].(type) {
		case map[string]any:
			version = int64(view["view_version"].(float64))
		case float64:
			version = int64(view)
		}
		res, err := session.ObserveUsage(ctx, version, ctxfold.Usage{
			InputTokens: num("input_tokens"), CachedInputTokens: num("cached_input_tokens"),
			OutputTokens: num("output_tokens"), FinishReason: str("finish_reason"),
		})
		if err != nil {
			return nil, err
		}
		return map[string]any{"calibration": res.Calibration, "calibration_accepted": res.CalibrationAccepted}, nil
	case "get_context_state":
		state, err := session.ContextState(ctx)
		if err != nil {
			return nil, err
		}
		return jsonValue(state)
	case "fork":
		at := ctxfold.ForkAtHead()
		if !flag("at_head") {
			at = ctxfold.ForkAtSeq(num("at_seq"))
		}
		var overrides []ctxfold.ConfigOption
		if cfg, ok := args["config"]; ok {
			var err error
			if overrides, err = configOptions(cfg); err != nil {
				return nil, err
			}
		}
		fork, err := session.Fork(ctx, at, overrides...)
		if err != nil {
			return nil, err
		}
		return canonical(fork.Info().Proto()), nil
	case "rewind":
		info, err := session.Rewind(ctx, num("to_seq"))
		if err != nil {
			return nil, err
		}
		return canonical(info.Proto()), nil
	case "edit":
		msgs, err := messagesArg([]any{args["message"]})
		if err != nil {
			return nil, err
		}
		edited, err := session.EditWithRequestID(ctx, str("request_id"), num("seq"), msgs[0])
		if err != nil {
			return nil, err
		}
		return canonical(edited.Proto()), nil
	case "retry":
		return viewResult(session.Retry(ctx, num("answer_seq")))
	case "read_tool_result":
		read := session.ReadToolResult
		ref := str("result_ref")
		if ref == "" {
			read, ref = session.ReadToolResultByCallID, str("tool_call_id")
		}
		res, err := read(ctx, ref, ctxfold.PageBytes(num("page_bytes")))
		if err != nil {
			return nil, err
		}
		return jsonValue(map[string]any{"text": res.Text, "sha256": res.SHA256, "total_bytes": res.TotalBytes, "result_ref": res.ResultRef})
	case "tool_result_pages":
		pages := session.ToolResultPages
		ref := str("result_ref")
		if ref == "" {
			pages, ref = session.ToolResultPagesByCallID, str("tool_call_id")
		}
		var out []any
		for page, err := range pages(ctx, ref, ctxfold.FromOffset(num("offset")), ctxfold.PageBytes(num("page_bytes"))) {
			if err != nil {
				return nil, err
			}
			out = append(out, map[string]any{
				"data": page.Data, "offset": page.Offset, "next_offset": page.NextOffset, "total_bytes": page.TotalBytes,
				"sha256": page.SHA256, "complete": page.Complete, "result_ref": page.ResultRef,
			})
		}
		return jsonValue(map[string]any{"pages": out})
	case "list_checkpoints":
		opts := []ctxfold.ListOption{pageSize}
		if flag("include_abandoned") {
			opts = append(opts, ctxfold.IncludeAbandoned())
		}
		return collect("checkpoints", session.Checkpoints(ctx, opts...), ctxfold.Checkpoint.Proto)
	case "get_checkpoint":
		cp, err := session.GetCheckpoint(ctx, str("checkpoint_id"))
		if err != nil {
			return nil, err
		}
		return canonical(cp.Proto()), nil
	case "dispatch_tool_call":
		content, handled, err := session.DispatchToolCall(ctx, str("name"), str("arguments"))
		if err != nil || !handled {
			return map[string]any{"content": nil}, err
		}
		return map[string]any{"content": content}, nil
	case "tool_definitions":
		defs, err := ctxfold.ToolDefinitions(ctxfold.ToolFormat(str("format")))
		if err != nil {
			return nil, err
		}
		return jsonValue(map[string]any{"tools": defs})
	case "to_openai_chat", "to_openai_responses", "to_anthropic_messages":
		tools, _ := toolsArg(args, raw)
		return toProvider(op, args, tools)
	case "from_openai_chat", "from_openai_responses", "from_anthropic_messages":
		return fromProvider(op, str("fixture"))
	case "from_openai_chat_messages":
		var recorded []openaichat.Message
		if err := json.Unmarshal(raw["messages"], &recorded); err != nil {
			return nil, err
		}
		msgs, err := openaichat.FromMessages(recorded)
		if err != nil {
			return nil, err
		}
		return map[string]any{"messages": canonicalList(msgs, ctxfold.Message.Proto)}, nil
	}
	return nil, fmt.Errorf("unknown op %q", op)
}

// sessionID is the id of a step's "session" argument: a saved session or an id.
func sessionID(target any) string {
	switch s := target.(type) {
	case map[string]any:
		id, _ := s["id"].(string)
		return id
	case string:
		return s
	}
	return ""
}

func messagesArg(value any) ([]ctxfold.Message, error) {
	list, _ := value.([]any)
	msgs := make([]ctxfold.Message, len(list))
	for i, item := range list {
		m := &ctxfoldv1.Message{}
		if err := fromJSON(item, m); err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
		msgs[i] = ctxfold.MessageFromProto(m)
	}
	return msgs, nil
}

// configOptions are the options of a config given as proto JSON: its fields, and its tools_json
// through ToolsJSON (which writes them in the one form).
func configOptions(value any) ([]ctxfold.ConfigOption, error) {
	pc := &ctxfoldv1.SessionConfig{}
	if err := fromJSON(value, pc); err != nil {
		return nil, err
	}
	fields := ctxfold.SessionConfigFromProto(pc)
	set := func(c *ctxfold.SessionConfig) error { *c = fields; return nil }
	return []ctxfold.ConfigOption{set, ctxfold.ToolsJSON(pc.GetToolsJson())}, nil
}

// toolsArg is the "tools" argument as raw JSON values: a generated {"$tool_definitions"} or the
// list as written (in its key order).
func toolsArg(args map[string]any, raw map[string]json.RawMessage) ([]json.RawMessage, bool) {
	if generated, ok := args["tools"].([]json.RawMessage); ok {
		return generated, true
	}
	var tools []json.RawMessage
	if text, ok := raw["tools"]; !ok || json.Unmarshal(text, &tools) != nil {
		return nil, false
	}
	return tools, true
}

// fromJSON reads a JSON-shaped value as proto JSON into m.
func fromJSON(value any, m proto.Message) error {
	data, err := json.Marshal(value)
	if err != nil {
		return err
	}
	return protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(data, m)
}

func viewResult(view *ctxfold.View, err error) (any, error) {
	if err != nil {
		return nil, err
	}
	return canonical(view.Proto()), nil
}

func eventsResult(events func(func(ctxfold.Event, error) bool)) (any, error) {
	progress := []any{}
	var result any
	for ev, err := range events {
		if err != nil {
			return nil, err
		}
		if ev.Progress != nil {
			progress = append(progress, canonical(ev.Progress.Proto()))
		}
		if ev.View != nil {
			result = canonical(ev.View.Proto())
		}
	}
	return map[string]any{"progress": progress, "result": result}, nil
}

func collect[T any, P proto.Message](key string, items func(func(T, error) bool), toProto func(T) P) (any, error) {
	out := []any{}
	for item, err := range items {
		if err != nil {
			return nil, err
		}
		out = append(out, canonical(toProto(item)))
	}
	return map[string]any{key: out}, nil
}

func canonicalList[T any, P proto.Message](items []T, toProto func(T) P) []any {
	out := make([]any, len(items))
	for i, item := range items {
		out[i] = canonical(toProto(item))
	}
	return out
}

// canonical is the canonical JSON form of a result message: snake_case names, enums by name,
// 64-bit integers as numbers, every field present.
func canonical(m proto.Message) any {
	return canonicalMessage(m.ProtoReflect())
}

func canonicalMessage(m protoreflect.Message) any {
	if ts, ok := m.Interface().(*timestamppb.Timestamp); ok {
		if !m.IsValid() {
			return nil
		}
		return ts.AsTime().UTC().Format(time.RFC3339Nano)
	}
	out := map[string]any{}
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		value := m.Get(fd)
		if fd.IsList() {
			list := value.List()
			items := make([]any, list.Len())
			for j := range list.Len() {
				items[j] = canonicalValue(fd, list.Get(j))
			}
			out[string(fd.Name())] = items
			continue
		}
		if fd.IsMap() {
			entries := map[string]any{}
			value.Map().Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
				entries[k.String()] = canonicalValue(fd.MapValue(), v)
				return true
			})
			out[string(fd.Name())] = entries
			continue
		}
		if fd.Message() != nil && !m.Has(fd) {
			out[string(fd.Name())] = nil
			continue
		}
		out[string(fd.Name())] = canonicalValue(fd, value)
	}
	return out
}

func canonicalValue(fd protoreflect.FieldDescriptor, v protoreflect.Value) any {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return canonicalMessage(v.Message())
	case protoreflect.EnumKind:
		if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
			return string(ev.Name())
		}
		return float64(v.Enum())
	case protoreflect.Int32Kind, protoreflect.Int64Kind, protoreflect.Sint32Kind, protoreflect.Sint64Kind,
		protoreflect.Sfixed32Kind, protoreflect.Sfixed64Kind:
		return float64(v.Int())
	case protoreflect.Uint32Kind, protoreflect.Uint64Kind, protoreflect.Fixed32Kind, protoreflect.Fixed64Kind:
		return float64(v.Uint())
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		return v.Float()
	case protoreflect.BytesKind:
		return v.Bytes()
	}
	return v.Interface()
}

// jsonValue is value as encoding/json reads it back (numbers as float64), like the expectations.
func jsonValue(value any) (any, error) {
	data, err := json.Marshal(value)
	if err != nil {
		return nil, err
	}
	var out any
	return out, json.Unmarshal(data, &out)
}

// toProvider converts a view given as proto JSON (a saved View or a literal) to a request.
func toProvider(op string, args map[string]any, tools []json.RawMessage) (any, error) {
	pc := &ctxfoldv1.PreparedContext{}
	if err := fromJSON(args["view"], pc); err != nil {
		return nil, fmt.Errorf("view: %w", err)
	}
	view := ctxfold.ViewFromProto(pc)
	model, _ := args["model"].(string)
	maxTokens, _ := args["max_tokens"].(float64)
	switch op {
	case "to_openai_chat":
		return jsonValue(openaichat.NewRequest(view, openaichat.Options{Model: model, Tools: tools, MaxCompletionTokens: int64(maxTokens)}))
	case "to_openai_responses":
		return jsonValue(openairesponses.NewRequest(view, openairesponses.Options{Model: model, Tools: tools, MaxOutputTokens: int64(maxTokens)}))
	default:
		req, err := anthropic.NewRequest(view, anthropic.Options{Model: model, Tools: tools, MaxTokens: int64(maxTokens)})
		if err != nil {
			return nil, err
		}
		return jsonValue(req)
	}
}

// fromProvider converts a recorded provider response of fixtures/ to messages and usage.
func fromProvider(op, fixture string) (any, error) {
	body, err := os.ReadFile(filepath.Join(conformanceDir, "fixtures", fixture))
	if err != nil {
		return nil, err
	}
	var turn *ctxfold.ProviderTurn
	switch op {
	case "from_openai_chat":
		turn, err = openaichat.ParseResponse(body)
	case "from_openai_responses":
		turn, err = openairesponses.ParseResponse(body)
	default:
		turn, err = anthropic.ParseResponse(body)
	}
	if err != nil {
		return nil, err
	}
	u := turn.Usage
	return jsonValue(map[string]any{
		"messages": canonicalList(turn.Messages, ctxfold.Message.Proto),
		"usage": map[string]any{
			"input_tokens": u.InputTokens, "cached_input_tokens": u.CachedInputTokens,
			"output_tokens": u.OutputTokens, "finish_reason": u.FinishReason,
		},
	})
}
