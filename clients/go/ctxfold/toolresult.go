package ctxfold

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"iter"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/ctxfold/ctxfold/clients/go/ctxfoldv1"
)

// DefaultPageBytes, MinPageBytes and MaxPageBytes bound one page of a tool result read.
const (
	DefaultPageBytes = 16384
	MinPageBytes     = 4
	MaxPageBytes     = 24576
)

// ToolResult is a whole raw tool result read back from the server.
type ToolResult struct {
	// Text is the exact raw result (UTF-8).
	Text string
	// SHA256 is the lowercase hex SHA-256 of the raw result (checked against Text).
	SHA256 string
	// TotalBytes is the size of the raw result in UTF-8 bytes.
	TotalBytes int64
	// ResultRef is the reference the server resolved (also when read by tool call id).
	ResultRef string
}

// ToolResultPage is one page of a raw tool result, as one ReadToolResult call returns it.
type ToolResultPage struct {
	// Data is the page: whole UTF-8 characters.
	Data string
	// Offset is the UTF-8 byte offset the page starts at.
	Offset int64
	// NextOffset is the offset of the next page (TotalBytes at the end).
	NextOffset int64
	// TotalBytes is the size of the whole raw result.
	TotalBytes int64
	// SHA256 is the lowercase hex SHA-256 of the whole raw result.
	SHA256 string
	// Complete reports whether this page reaches the end of the result.
	Complete bool
	// ResultRef is the reference that was read.
	ResultRef string
}

// ReadOption tunes the tool result readers.
type ReadOption func(*readSettings)

type readSettings struct {
	pageBytes int64
	offset    int64
}

// PageBytes sets the maximum bytes per page (MinPageBytes..MaxPageBytes; default DefaultPageBytes).
func PageBytes(n int64) ReadOption { return func(s *readSettings) { s.pageBytes = n } }

// FromOffset starts [Session.ToolResultPages] at this UTF-8 byte offset (on a character boundary).
func FromOffset(offset int64) ReadOption { return func(s *readSettings) { s.offset = offset } }

// ReadToolResult reads the whole raw tool result named by resultRef (as found in a tool message's
// ResultRef, a pruned marker, a summary or View.FoldedResultsRef), page by page, and checks its
// size and SHA-256 (an *Error with ReasonResultChecksumMismatch, code DataLoss, when they differ).
func (s *Session) ReadToolResult(ctx context.Context, resultRef string, opts ...ReadOption) (*ToolResult, error) {
	return s.readWhole(ctx, resultSelector{ref: resultRef}, opts)
}

// ReadToolResultByCallID is ReadToolResult naming the result by the tool call it answers (the call
// id must be unique in the session, else the reason is ReasonResultRefAmbiguous).
func (s *Session) ReadToolResultByCallID(ctx context.Context, toolCallID string, opts ...ReadOption) (*ToolResult, error) {
	return s.readWhole(ctx, resultSelector{callID: toolCallID}, opts)
}

// ToolResultPages iterates over the pages of the raw tool result named by resultRef, one request
// per page, from [FromOffset] (default 0). The iteration stops after yielding an error.
func (s *Session) ToolResultPages(ctx context.Context, resultRef string, opts ...ReadOption) iter.Seq2[*ToolResultPage, error] {
	return s.pages(ctx, resultSelector{ref: resultRef}, readOptions(opts))
}

// ToolResultPagesByCallID is ToolResultPages naming the result by the tool call it answers.
func (s *Session) ToolResultPagesByCallID(ctx context.Context, toolCallID string, opts ...ReadOption) iter.Seq2[*ToolResultPage, error] {
	return s.pages(ctx, resultSelector{callID: toolCallID}, readOptions(opts))
}

// resultSelector names a stored result by reference or by the tool call it answers.
type resultSelector struct{ ref, callID string }

func readOptions(opts []ReadOption) readSettings {
	var rs readSettings
	for _, opt := range opts {
		opt(&rs)
	}
	return rs
}

// check refuses, before any call, what the server would: no result named, a page size outside
// its range, a negative offset, no session id.
func (rs readSettings) check(s *Session, sel resultSelector) error {
	switch {
	case sel.ref == "" && sel.callID == "":
		return withOp("ReadToolResult", invalidArgument(ReasonResultRefRequired, "result_ref", "name the tool result by result_ref or tool_call_id"))
	case rs.pageBytes != 0 && (rs.pageBytes < MinPageBytes || rs.pageBytes > MaxPageBytes):
		return withOp("ReadToolResult", invalidArgument(ReasonLimitOutOfRange, "page_bytes",
			"page_bytes must be within [%d, %d], got %d", MinPageBytes, MaxPageBytes, rs.pageBytes))
	case rs.offset < 0:
		return withOp("ReadToolResult", invalidArgument(ReasonOffsetOutOfRange, "offset", "offset must be >= 0, got %d", rs.offset))
	}
	return requireSessionID("ReadToolResult", s.id)
}

func (s *Session) readWhole(ctx context.Context, sel resultSelector, opts []ReadOption) (*ToolResult, error) {
	rs := readOptions(opts)
	rs.offset = 0 // the checksum covers the whole result
	var (
		text strings.Builder
		last *ToolResultPage
	)
	for page, err := range s.pages(ctx, sel, rs) {
		if err != nil {
			return nil, err
		}
		text.WriteString(page.Data)
		last = page
	}
	out := &ToolResult{Text: text.String(), SHA256: last.SHA256, TotalBytes: last.TotalBytes, ResultRef: last.ResultRef}
	sum := sha256.Sum256([]byte(out.Text))
	if int64(len(out.Text)) != out.TotalBytes || hex.EncodeToString(sum[:]) != strings.ToLower(out.SHA256) {
		return nil, sdkError("ReadToolResult", codes.DataLoss, ReasonResultChecksumMismatch,
			"read %d bytes with sha256 %x, the server announced %d bytes with sha256 %s",
			len(out.Text), sum, out.TotalBytes, out.SHA256)
	}
	return out, nil
}

func (s *Session) pages(ctx context.Context, sel resultSelector, rs readSettings) iter.Seq2[*ToolResultPage, error] {
	if err := rs.check(s, sel); err != nil {
		return failed[*ToolResultPage](err)
	}
	return func(yield func(*ToolResultPage, error) bool) {
		offset := rs.offset
		for {
			page, err := s.readPage(ctx, sel, offset, rs.pageBytes)
			if err != nil {
				yield(nil, err)
				return
			}
			if page.Offset != offset || page.NextOffset != offset+int64(len(page.Data)) || (!page.Complete && len(page.Data) == 0) {
				yield(nil, sdkError("ReadToolResult", codes.Internal, ReasonProtocolViolation,
					"the page asked at offset %d came back at offset %d with %d bytes and next offset %d",
					offset, page.Offset, len(page.Data), page.NextOffset))
				return
			}
			if !yield(page, nil) || page.Complete {
				return
			}
			// Later pages name the result by the reference the server resolved.
			if page.ResultRef != "" {
				sel = resultSelector{ref: page.ResultRef}
			}
			offset = page.NextOffset
		}
	}
}

// readPage makes one ReadToolResult call.
func (s *Session) readPage(ctx context.Context, sel resultSelector, offset, pageBytes int64) (*ToolResultPage, error) {
	ctx, cancel := s.client.unaryContext(ctx)
	defer cancel()
	resp, err := s.client.raw.ReadToolResult(ctx, &ctxfoldv1.ReadToolResultRequest{
		SessionId: s.id, ResultRef: sel.ref, ToolCallId: sel.callID, Offset: offset, Limit: pageBytes,
	})
	if err != nil {
		return nil, AsError("ReadToolResult", err)
	}
	return &ToolResultPage{
		Data: resp.GetData(), Offset: resp.GetOffset(), NextOffset: resp.GetNextOffset(), TotalBytes: resp.GetTotalBytes(),
		SHA256: resp.GetSha256(), Complete: resp.GetComplete(), ResultRef: resp.GetResultRef(),
	}, nil
}
