package trace

import (
	"bytes"
	"testing"
)

// checkRead asserts the invariants Read promises on any input it accepts.
func checkRead(t *testing.T, data []byte, f Format) {
	reqs, err := Read(bytes.NewReader(data), "fuzz", f)
	if err != nil {
		return
	}
	if len(reqs) == 0 {
		t.Fatal("accepted a trace with no request")
	}
	if reqs[0].Arrival != 0 {
		t.Fatalf("first arrival %v, want 0", reqs[0].Arrival)
	}
	for i, r := range reqs {
		if i > 0 && r.Arrival < reqs[i-1].Arrival {
			t.Fatalf("arrivals not sorted at %d", i)
		}
		if r.InputTokens < 0 || r.OutputTokens < 0 {
			t.Fatalf("negative tokens: %+v", r)
		}
	}
	_ = Summarize(reqs)
}

func FuzzReadMooncake(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 600, "output_length": 6, "hash_ids": [0, 1]}` + "\n" +
		`{"timestamp": 12.5, "input_length": 10, "output_length": 1, "hash_ids": [0]}`))
	f.Add([]byte(`{"timestamp": 5, "input_length": 1, "output_length": 1}`))
	f.Add([]byte("\n\n{}\n"))
	f.Add([]byte(`{"timestamp": 1e300, "input_length": 1, "output_length": 1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkRead(t, data, FormatMooncake)
		checkRead(t, data, FormatAuto)
	})
}

func FuzzReadAzure(f *testing.F) {
	f.Add([]byte("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"))
	f.Add([]byte("\ufefftimestamp,generatedtokens,contexttokens\r\n2024-05-10 00:00:00.009930+00:00,1,2\r\n"))
	f.Add([]byte("TIMESTAMP,ContextTokens,GeneratedTokens\n\"2023-11-16 18:15:46\",\"1\",2\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkRead(t, data, FormatAzure)
		checkRead(t, data, FormatAuto)
	})
}

func FuzzReadSessions(f *testing.F) {
	f.Add([]byte(`{"session_id":"a","input_length":1000,"output_length":700,"hash_ids":[0,1],"timestamp":0.0}` + "\n" +
		`{"session_id":"b","input_length":512,"output_length":10,"hash_ids":[0],"timestamp":0.0}` + "\n" +
		`{"session_id":"a","input_length":600,"output_length":5,"hash_ids":[9,10],"delay":2000.0}`))
	f.Add([]byte(`{"session_id":"a","input_length":1,"output_length":2147483647,"hash_ids":[3],"timestamp":5e12}` + "\n" +
		`{"session_id":"a","input_length":1,"output_length":1,"hash_ids":[4],"delay":5e12}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkRead(t, data, FormatSessions)
	})
}
