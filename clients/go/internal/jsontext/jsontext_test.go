package jsontext

import (
	"encoding/json"
	"testing"
)

func TestNumbersAreWrittenAsJavaScriptWritesThem(t *testing.T) {
	for literal, want := range map[string]string{
		"1.0": "1", "0.5": "0.5", "1e-7": "1e-7", "1E-6": "0.000001", "1.5e-6": "0.0000015", "1e21": "1e+21",
		"1e20": "100000000000000000000", "1e16": "10000000000000000", "-2.5": "-2.5", "5e-324": "5e-324",
		"-0": "0", "-0.0": "0", "12": "12", "1180591620717411303424": "1180591620717411303424", "1e2": "100",
	} {
		got, err := Normalize([]byte(literal))
		if err != nil || string(got) != want {
			t.Errorf("%s: got %s (%v), want %s", literal, got, err, want)
		}
	}
}

func TestStringsKeepWhatJSONDoesNotNeedEscaped(t *testing.T) {
	got, err := Normalize([]byte(`{ "z" : 1, "a" : ["\u003c&'=>", "é🙂\u2028", "q\"\\", "\n\t\u0001\u007f", "\/"] }`))
	want := "{\"z\":1,\"a\":[\"<&'=>\",\"é🙂\u2028\",\"q\\\"\\\\\",\"\\n\\t\\u0001\x7f\",\"/\"]}"
	if err != nil || string(got) != want {
		t.Errorf("got %s (%v)\nwant %s", got, err, want)
	}
	for _, bad := range []string{`{"a":`, `[1] [2]`, ``} {
		if _, err := Normalize([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestMarshalKeepsTheOrderOfRawMessagesAndStructs(t *testing.T) {
	value := struct {
		B []json.RawMessage `json:"b"`
		A float64           `json:"a"`
	}{B: []json.RawMessage{json.RawMessage(`{"y": "<", "x": 1.0}`)}, A: 2}
	got, err := Marshal(value)
	if want := `{"b":[{"y":"<","x":1}],"a":2}`; err != nil || string(got) != want {
		t.Errorf("got %s (%v), want %s", got, err, want)
	}
}
