package stack

import (
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	// A command name with a space and a ')' must not shift the fields.
	line := "4242 (a b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0 1 2 3"
	got, err := parseStatCPU(line)
	if err != nil {
		t.Fatal(err)
	}
	if want := 3250 * time.Millisecond; got != want {
		t.Fatalf("cpu = %v, want %v (utime 250 + stime 75 ticks)", got, want)
	}
	for _, bad := range []string{"4242 no parens", "1 (x) S 1 2", "1 (x) S 1 2 3 4 5 6 7 8 9 10 x 0"} {
		if _, err := parseStatCPU(bad); err == nil {
			t.Errorf("parseStatCPU(%q): want an error", bad)
		}
	}
}

func TestProcCPUTime(t *testing.T) {
	p := &Proc{Name: "spin", Bin: "/bin/sh", Args: []string{"-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 5"}, Log: t.TempDir() + "/spin.log"}
	if _, err := p.CPUTime(); err == nil {
		t.Fatal("CPUTime of a process never started: want an error")
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	deadline := time.Now().Add(10 * time.Second)
	for {
		d, err := p.CPUTime()
		if err != nil {
			t.Fatal(err)
		}
		if d > 0 {
			return // the busy loop has been charged to the process
		}
		if time.Now().After(deadline) {
			t.Fatal("a busy shell loop used no CPU time in 10 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
