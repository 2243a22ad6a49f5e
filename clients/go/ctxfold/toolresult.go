package ctxfold

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"iter"
	"strings"

	"github.com/ctxfold/ctxfold/clients/go/ctxfoldv1"
)

// ErrToolResultMismatch is returned (wrapped) when a tool result read page by page does not match
// the size or SHA-256 the server announced, or the pages do not line up.
var ErrToolResultMismatch = errors.New("ctxfold: tool result pages do not match the announced size or sha256")

// ToolResult is a whole raw tool result read back from the server.
type ToolResult struct {
	// ResultRef is the reference the result was read by.
	ResultRef string
	// Data is the exact raw result (UTF-8).
	Data string
	// TotalBytes is the size of the raw result in UTF-8 bytes.
	TotalBytes int64
	// SHA256 is the lowercase hex SHA-256 of the raw result (checked against Data).
	SHA256 string
	// Pages is the number of ReadToolResult calls it took.
	Pages int
}

// ReadOption tunes the tool result readers.
type ReadOption func(*readSettings)

type readSettings struct {
	pageBytes int64
	offset    int64
}

// ReadPageBytes sets the maximum bytes per page (server range 4..24576, default 16384).
func ReadPageBytes(n int64) ReadOption { return func(s *readSettings) { s.pageBytes = n } }

// ReadFromOffset starts reading at this UTF-8 byte offset (must be on a character boundary).
// Whole-result readers then skip the SHA-256 check, which covers the whole result only.
func ReadFromOffset(offset int64) ReadOption { return func(s *readSettings) { s.offset = offset } }

// ReadToolResult reads the whole raw tool result named by resultRef (as found in a tool message's
// ResultRef, a pruned marker or a summary), page by page, and checks its size and SHA-256.
func (s *Session) ReadToolResult(ctx context.Context, resultRef string, opts ...ReadOption) (*ToolResult, error) {
	return s.readWhole(ctx, &ctxfoldv1.ReadToolResultRequest{SessionId: s.id, ResultRef: resultRef}, opts)
}

// ReadToolResultByCallID is ReadToolResult naming the result by the tool call it answers (the call
// id must be unique in the session, else the error reason is RESULT_REF_AMBIGUOUS).
func (s *Session) ReadToolResultByCallID(ctx context.Context, toolCallID string, opts ...ReadOption) (*ToolResult, error) {
	return s.readWhole(ctx, &ctxfoldv1.ReadToolResultRequest{SessionId: s.id, ToolCallId: toolCallID}, opts)
}

func (s *Session) readWhole(ctx context.Context, first *ctxfoldv1.ReadToolResultRequest, opts []ReadOption) (*ToolResult, error) {
	var rs readSettings
	for _, opt := range opts {
		opt(&rs)
	}
	var (
		data strings.Builder
		last *ctxfoldv1.ReadToolResultResponse
		out  ToolResult
	)
	for page, err := range s.toolResultPages(ctx, first, rs) {
		if err != nil {
			return nil, err
		}
		data.WriteString(page.GetData())
		last = page
		out.Pages++
	}
	out.ResultRef, out.Data = last.GetResultRef(), data.String()
	out.TotalBytes, out.SHA256 = last.GetTotalBytes(), last.GetSha256()
	if rs.offset == 0 {
		if int64(len(out.Data)) != out.TotalBytes {
			return nil, fmt.Errorf("%w: read %d bytes, server announced %d", ErrToolResultMismatch, len(out.Data), out.TotalBytes)
		}
		sum := sha256.Sum256([]byte(out.Data))
		if got := hex.EncodeToString(sum[:]); got != strings.ToLower(out.SHA256) {
			return nil, fmt.Errorf("%w: sha256 %s, server announced %s", ErrToolResultMismatch, got, out.SHA256)
		}
	}
	return &out, nil
}

// ToolResultPages iterates over the pages of a raw tool result named by resultRef, as the server
// returns them. The iteration stops after yielding an error.
func (s *Session) ToolResultPages(ctx context.Context, resultRef string, opts ...ReadOption) iter.Seq2[*ctxfoldv1.ReadToolResultResponse, error] {
	var rs readSettings
	for _, opt := range opts {
		opt(&rs)
	}
	return s.toolResultPages(ctx, &ctxfoldv1.ReadToolResultRequest{SessionId: s.id, ResultRef: resultRef}, rs)
}

func (s *Session) toolResultPages(ctx context.Context, first *ctxfoldv1.ReadToolResultRequest, rs readSettings) iter.Seq2[*ctxfoldv1.ReadToolResultResponse, error] {
	return func(yield func(*ctxfoldv1.ReadToolResultResponse, error) bool) {
		req := &ctxfoldv1.ReadToolResultRequest{
			SessionId: first.GetSessionId(), ToolCallId: first.GetToolCallId(), ResultRef: first.GetResultRef(),
			Offset: rs.offset, Limit: rs.pageBytes,
		}
		for {
			page, err := s.ReadToolResultPage(ctx, req)
			if err != nil {
				yield(nil, err)
				return
			}
			if page.GetOffset() != req.GetOffset() ||
				(!page.GetComplete() && page.GetNextOffset() <= req.GetOffset()) ||
				page.GetNextOffset() != page.GetOffset()+int64(len(page.GetData())) {
				yield(nil, fmt.Errorf("%w: page at %d returned offset %d, next %d, %d bytes",
					ErrToolResultMismatch, req.GetOffset(), page.GetOffset(), page.GetNextOffset(), len(page.GetData())))
				return
			}
			if !yield(page, nil) || page.GetComplete() {
				return
			}
			// Later pages name the result by the reference the server resolved.
			req = &ctxfoldv1.ReadToolResultRequest{
				SessionId: s.id, ResultRef: page.GetResultRef(), Offset: page.GetNextOffset(), Limit: rs.pageBytes,
			}
			if req.ResultRef == "" {
				req.ResultRef, req.ToolCallId = first.GetResultRef(), first.GetToolCallId()
			}
		}
	}
}

// ReadToolResultPage makes one ReadToolResult call (SessionId is filled in when empty).
func (s *Session) ReadToolResultPage(ctx context.Context, req *ctxfoldv1.ReadToolResultRequest) (*ctxfoldv1.ReadToolResultResponse, error) {
	if req.GetSessionId() == "" {
		req.SessionId = s.id
	}
	ctx, cancel := s.client.unaryContext(ctx)
	defer cancel()
	resp, err := s.client.raw.ReadToolResult(ctx, req)
	if err != nil {
		return nil, AsError("ReadToolResult", err)
	}
	return resp, nil
}
