package ctxfold

// ProviderTurn is a provider response as the agent loop needs it: the messages to append (the assistant
// message, with its tool calls) and the usage to report with [Session.ObserveUsage]. The adapters
// in openaichat, openairesponses and anthropic return it.
type ProviderTurn struct {
	// Messages are the messages to append, in order.
	Messages []Message
	// Usage is what the provider billed.
	Usage Usage
}

// ToolCalls returns the tool calls of the turn's messages, in order.
func (t *ProviderTurn) ToolCalls() []ToolCall {
	var calls []ToolCall
	for _, m := range t.Messages {
		calls = append(calls, m.ToolCalls...)
	}
	return calls
}
