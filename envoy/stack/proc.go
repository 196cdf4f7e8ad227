package stack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is one child process that can be stopped and started again with the same arguments.
type Proc struct {
	Name string
	Bin  string
	Args []string
	Log  string   // file receiving stdout and stderr
	Env  []string // added to this process's environment (KEY=value)

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Start launches the process; it is an error to start a running one.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s is already running", p.Name)
	}
	logf, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("%s: log file: %w", p.Name, err)
	}
	cmd := exec.Command(p.Bin, p.Args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if len(p.Env) > 0 {
		cmd.Env = append(os.Environ(), p.Env...)
	}
	// Own process group, so Stop reaches grandchildren and a test's Ctrl-C does not race it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}()
	p.cmd, p.done = cmd, done
	return nil
}

// Running reports whether the process was started and has not exited.
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Kill stops the process at once (SIGKILL), as a crash would.
func (p *Proc) Kill() { p.stop(syscall.SIGKILL, 0) }

// Stop asks the process to exit (SIGTERM) and kills it after grace.
func (p *Proc) Stop(grace time.Duration) { p.stop(syscall.SIGTERM, grace) }

func (p *Proc) stop(sig syscall.Signal, grace time.Duration) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd, p.done = nil, nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	// A process that already exited may have had its pid reused (pids wrap within minutes
	// on a busy machine): never signal a group we no longer own.
	select {
	case <-done:
		return
	default:
	}
	_ = syscall.Kill(-cmd.Process.Pid, sig)
	select {
	case <-done:
		return
	case <-time.After(grace):
	}
	select {
	case <-done:
		return
	default:
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// FreePort returns a loopback port that was free a moment ago. Two calls in a row can
// return the same port (the kernel may hand a port just closed to the next listener):
// code that needs several distinct ports takes them from one Ports.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Ports hands out loopback ports that were free a moment ago, never one it has handed out
// before. The zero value is ready to use; it is safe for concurrent use.
type Ports struct {
	mu    sync.Mutex
	given map[int]bool
	free  func() (int, error) // FreePort when nil (tests replace it)
}

// Port returns a free loopback port this Ports has not returned before.
func (p *Ports) Port() (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.given == nil {
		p.given = map[int]bool{}
	}
	free := p.free
	if free == nil {
		free = FreePort
	}
	for range 100 {
		port, err := free()
		if err != nil {
			return 0, err
		}
		if !p.given[port] {
			p.given[port] = true
			return port, nil
		}
	}
	return 0, errors.New("stack: no loopback port not handed out already after 100 tries")
}

// Addr is Port as "127.0.0.1:port".
func (p *Ports) Addr() (string, error) {
	port, err := p.Port()
	return "127.0.0.1:" + strconv.Itoa(port), err
}

// WaitHTTP polls url until it answers with want or ctx ends.
func WaitHTTP(ctx context.Context, url string, want int) error {
	c := &http.Client{Timeout: time.Second}
	var last error
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == want {
				return nil
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		last = err
		select {
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("waiting for %s", url), last, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// clockTicks is Linux's USER_HZ, the unit of /proc/<pid>/stat times; it is 100 on every
// mainstream architecture.
const clockTicks = 100

// CPUTime is the processor time (user + system, all threads) the running process has used,
// from /proc; an error when it is not running or /proc is not Linux's.
func (p *Proc) CPUTime() (time.Duration, error) {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil {
		return 0, fmt.Errorf("%s is not running", p.Name)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
	if err != nil {
		return 0, fmt.Errorf("%s: cpu time: %w", p.Name, err)
	}
	return parseStatCPU(string(b))
}

// parseStatCPU reads utime and stime (fields 14 and 15) of a /proc/<pid>/stat line. The
// command name (field 2) may hold spaces and parentheses, so fields count from its last ')'.
func parseStatCPU(line string) (time.Duration, error) {
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return 0, fmt.Errorf("proc stat %q: no command field", line)
	}
	f := strings.Fields(line[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("proc stat %q: %d fields after the command, want >= 13", line, len(f))
	}
	var ticks int64
	for _, s := range f[11:13] { // fields 14 and 15 of the whole line
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("proc stat: cpu field %q: %w", s, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}
