package stack

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Pid is the running process's id, or 0 when it is not running.
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Signal sends sig to the process alone (not its group), for example SIGSTOP to freeze it
// as a stuck process would be, and SIGCONT to let it go on. A stopped process must be
// continued (or killed) before Stop's grace can help: SIGTERM waits while it is stopped.
func (p *Proc) Signal(sig syscall.Signal) error {
	pid := p.Pid()
	if pid == 0 {
		return fmt.Errorf("%s is not running", p.Name)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("signal %v to %s (pid %d): %w", sig, p.Name, pid, err)
	}
	return nil
}

// RSS is the process's resident set size in bytes, from /proc (Linux only).
func (p *Proc) RSS() (int64, error) {
	pid := p.Pid()
	if pid == 0 {
		return 0, fmt.Errorf("%s is not running", p.Name)
	}
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("%s: %w", p.Name, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: VmRSS %q: %w", p.Name, rest, err)
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("%s: %w", p.Name, err)
	}
	return 0, fmt.Errorf("%s: no VmRSS in /proc/%d/status", p.Name, pid)
}
