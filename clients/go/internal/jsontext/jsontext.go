// Package jsontext writes the one form of the JSON every ctxfold SDK writes itself (tool schemas,
// tool call arguments given as objects, Anthropic tool inputs): JavaScript's JSON.stringify, so the
// four SDKs write the same bytes (clients/README.md, "JSON the SDKs write"). encoding/json differs:
// it sorts map keys and escapes < > & U+2028 U+2029.
package jsontext

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Marshal writes v (any value encoding/json takes; json.RawMessage keeps its key order) in the one form.
func Marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return Normalize(buf.Bytes())
}

// Normalize rewrites JSON text in the one form: no whitespace, keys in their order, strings and
// numbers written as JSON.stringify writes them.
func Normalize(text []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.UseNumber()
	var out bytes.Buffer
	if err := writeValue(dec, &out); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("data after the JSON value")
	}
	return out.Bytes(), nil
}

func writeValue(dec *json.Decoder, out *bytes.Buffer) error {
	token, err := dec.Token()
	if err != nil {
		return err
	}
	switch t := token.(type) {
	case json.Delim:
		closing := byte('}')
		if t == '[' {
			closing = ']'
		}
		out.WriteByte(byte(t))
		for first := true; dec.More(); first = false {
			if !first {
				out.WriteByte(',')
			}
			if t == '{' {
				key, err := dec.Token()
				if err != nil {
					return err
				}
				writeString(out, key.(string)) // the decoder yields object keys as strings
				out.WriteByte(':')
			}
			if err := writeValue(dec, out); err != nil {
				return err
			}
		}
		if _, err := dec.Token(); err != nil { // the closing delimiter
			return err
		}
		out.WriteByte(closing)
	case string:
		writeString(out, t)
	case json.Number:
		number, err := writeNumber(t)
		if err != nil {
			return err
		}
		out.WriteString(number)
	case bool:
		out.WriteString(strconv.FormatBool(t))
	case nil:
		out.WriteString("null")
	}
	return nil
}

// writeString escapes only what JSON needs: the quote, the backslash and the control characters.
func writeString(out *bytes.Buffer, s string) {
	out.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			out.WriteString(`\"`)
		case r == '\\':
			out.WriteString(`\\`)
		case r == '\b':
			out.WriteString(`\b`)
		case r == '\f':
			out.WriteString(`\f`)
		case r == '\n':
			out.WriteString(`\n`)
		case r == '\r':
			out.WriteString(`\r`)
		case r == '\t':
			out.WriteString(`\t`)
		case r < 0x20:
			fmt.Fprintf(out, `\u%04x`, r)
		default:
			out.WriteRune(r)
		}
	}
	out.WriteByte('"')
}

// writeNumber keeps an integer's digits and writes any other number as JavaScript does (the
// shortest form that reads back the same; encoding/json formats float64 that way).
func writeNumber(n json.Number) (string, error) {
	literal := n.String()
	if !strings.ContainsAny(literal, ".eE") {
		if literal == "-0" {
			return "0", nil
		}
		return literal, nil
	}
	f, err := n.Float64()
	if err != nil {
		return "", err
	}
	if f == 0 {
		return "0", nil // no negative zero in JavaScript's text
	}
	written, err := json.Marshal(f)
	return string(written), err
}
