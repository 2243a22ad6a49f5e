package ctxfold

// ContextState is a session's context state document (schema version 3), as
// [Session.ContextState] returns it: the server's bookkeeping, for diagnostics. Fields a newer
// server adds are left out.
type ContextState struct {
	SchemaVersion     int    `json:"schema_version"`
	Fingerprint       string `json:"fingerprint"`
	Generation        int64  `json:"generation"`
	TranscriptVersion int64  `json:"transcript_version"`
	// CheckpointID is the head checkpoint ("" when nothing was folded).
	CheckpointID string `json:"checkpoint_id"`
	CoveredCount int64  `json:"covered_count"`
	SummaryHash  string `json:"summary_hash"`
	// Pruned maps the id of each pruned message to the tokens of its pruned stub.
	Pruned            map[string]int64 `json:"pruned"`
	ProjectionVersion int64            `json:"projection_version"`
	SourceTokens      int64            `json:"source_tokens"`
	ProjectionTokens  int64            `json:"projection_tokens"`
	PromptCacheKey    string           `json:"prompt_cache_key"`
	// CacheState is warm, cold or unknown.
	CacheState string `json:"cache_state"`
	// LastActivity is the time of the last Prepare, in seconds since the Unix epoch.
	LastActivity     float64          `json:"last_activity"`
	Calibration      float64          `json:"calibration"`
	Views            []ViewRecord     `json:"views"`
	FailedFoldTokens int64            `json:"failed_fold_tokens"`
	Receipts         []Receipt        `json:"receipts"`
	LastReceipt      *Receipt         `json:"last_receipt"`
	Telemetry        map[string]int64 `json:"telemetry"`
}

// ViewRecord is a view the server answered: its version and uncalibrated input estimate.
type ViewRecord struct {
	Version         int64 `json:"version"`
	EstimatedTokens int64 `json:"estimated_tokens"`
}

// Receipt is what one maintenance step did.
type Receipt struct {
	OperationID string `json:"operation_id"`
	// Status is applied, noop, blocked or failed; Action is prune, summary or noop.
	Status    string  `json:"status"`
	Action    string  `json:"action"`
	TokensIn  int64   `json:"tokens_in"`
	TokensOut int64   `json:"tokens_out"`
	Reason    string  `json:"reason"`
	Time      float64 `json:"time"`
	// TokensSaved is set on the last receipt.
	TokensSaved int64 `json:"tokens_saved"`
}
