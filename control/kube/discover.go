package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/meridian-router/meridian/control/fleet"
)

// The annotations and labels a discovered engine's objects may carry.
const (
	AnnotationModels   = "meridian.dev/models"       // comma-separated model names
	AnnotationCapacity = "meridian.dev/capacity-rps" // a number > 0; a label of that name also works
	LabelRegion        = "topology.kubernetes.io/region"
	LabelZone          = "topology.kubernetes.io/zone"
	labelServiceName   = discoveryv1.LabelServiceName
)

// PoolResource is the InferencePool API the Discoverer watches.
var PoolResource = schema.GroupVersionResource{Group: inferencev1.GroupName, Version: "v1", Resource: "inferencepools"}

// Options configure a Discoverer.
type Options struct {
	Config fleet.KubernetesDiscovery
	// Models are the fleet's models: their capacity_rps is the last default of an engine's.
	Models []fleet.Model
	// REST is the API server connection; nil means Config.Kubeconfig, or else in-cluster.
	REST *rest.Config
	Log  *slog.Logger
	// Metrics are shared by every Discoverer of a process (see NewMetrics).
	Metrics *Metrics
	// Debounce coalesces a burst of watch events into one update (default 50ms).
	Debounce time.Duration
	// Component names the reporter of Events (default meridian-control).
	Component string
}

// Discoverer watches the cluster and hands the engines it finds to a callback.
type Discoverer struct {
	opt      Options
	client   kubernetes.Interface
	dyn      dynamic.Interface
	services []labels.Selector
	pools    []labels.Selector
	trigger  chan struct{}

	// probe asks engines whose objects name no models for their /v1/models; during a scan
	// (Run's goroutine only) asking collects the addresses to ask.
	probe  *modelProber
	asking map[string]bool

	mu       sync.Mutex
	refs     map[string]corev1.ObjectReference // Discovered.Object -> the object, for Events
	reported map[string]string                 // object -> the problems last reported for it
}

// New checks the options and connects to the API server (lazily: nothing is sent yet).
func New(opt Options) (*Discoverer, error) {
	if opt.Log == nil || opt.Metrics == nil {
		return nil, errors.New("kube: a logger and metrics are required")
	}
	if opt.Debounce <= 0 {
		opt.Debounce = 50 * time.Millisecond
	}
	if opt.Component == "" {
		opt.Component = "meridian-control"
	}
	d := &Discoverer{opt: opt, trigger: make(chan struct{}, 1), refs: map[string]corev1.ObjectReference{}, reported: map[string]string{}}
	d.probe = newModelProber(opt.Log, opt.Metrics, d.Resync)
	for i, s := range opt.Config.Services {
		sel, err := labels.Parse(s.Selector)
		if err != nil {
			return nil, fmt.Errorf("discovery.kubernetes.services[%d].selector: %w", i, err)
		}
		d.services = append(d.services, sel)
	}
	for i, s := range opt.Config.InferencePools {
		sel, err := labels.Parse(s.Selector)
		if err != nil {
			return nil, fmt.Errorf("discovery.kubernetes.inference_pools[%d].selector: %w", i, err)
		}
		d.pools = append(d.pools, sel)
	}
	rc := opt.REST
	if rc == nil {
		var err error
		if opt.Config.Kubeconfig != "" {
			rc, err = clientcmd.BuildConfigFromFlags("", opt.Config.Kubeconfig)
		} else {
			rc, err = rest.InClusterConfig()
		}
		if err != nil {
			return nil, fmt.Errorf("discovery.kubernetes: connect to the API server: %w (set kubeconfig, or run in a pod with a service account)", err)
		}
	}
	rc = rest.CopyConfig(rc)
	rc.UserAgent = opt.Component
	var err error
	if d.client, err = kubernetes.NewForConfig(rc); err != nil {
		return nil, fmt.Errorf("discovery.kubernetes: %w", err)
	}
	if d.dyn, err = dynamic.NewForConfig(rc); err != nil {
		return nil, fmt.Errorf("discovery.kubernetes: %w", err)
	}
	return d, nil
}

// Client is the Discoverer's API client (leader election shares it).
func (d *Discoverer) Client() kubernetes.Interface { return d.client }

// Resync makes Run call apply again with what it knows now (for example after the fleet
// file changed, so problems are checked against the new file).
func (d *Discoverer) Resync() {
	select {
	case d.trigger <- struct{}{}:
	default:
	}
}

// Run watches until ctx is done. Once every watch has synced, and then after each change
// (coalesced), it calls apply with the engines found; apply returns the problems of the
// engines it left out (fleet.Fleet.WithDiscovered's), which Run reports with its own.
func (d *Discoverer) Run(ctx context.Context, apply func([]fleet.Discovered) []error) {
	ns := d.opt.Config.Namespace
	var synced []cache.InformerSynced
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { d.Resync() },
		UpdateFunc: func(any, any) { d.Resync() },
		DeleteFunc: func(any) { d.Resync() },
	}
	watch := func(inf cache.SharedIndexInformer, what string) cache.Indexer {
		_ = inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
			d.watchError(what, err)
			cache.DefaultWatchErrorHandler(ctx, r, err)
		})
		_, _ = inf.AddEventHandler(handler)
		synced = append(synced, inf.HasSynced)
		go inf.Run(ctx.Done())
		return inf.GetIndexer()
	}
	var slices, pools []cache.Indexer
	for _, sel := range d.services {
		f := informers.NewSharedInformerFactoryWithOptions(d.client, 0, informers.WithNamespace(ns),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel.String() }))
		slices = append(slices, watch(f.Discovery().V1().EndpointSlices().Informer(), "endpointslices.discovery.k8s.io"))
	}
	var pods cache.Indexer
	if len(d.pools) > 0 {
		f := informers.NewSharedInformerFactoryWithOptions(d.client, 0, informers.WithNamespace(ns))
		pods = watch(f.Core().V1().Pods().Informer(), "pods")
	}
	for _, sel := range d.pools {
		f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(d.dyn, 0, ns,
			func(o *metav1.ListOptions) { o.LabelSelector = sel.String() })
		pools = append(pools, watch(f.ForResource(PoolResource).Informer(), PoolResource.GroupResource().String()))
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return
	}
	d.opt.Log.Info("kubernetes discovery synced", "namespace", nsName(ns), "services", len(slices), "inference_pools", len(pools))
	// The first fleet waits (a bounded time) for the first answers of the engines asked
	// for their models, so that it has them rather than being refused for lacking them.
	firstBy, first := time.Now().Add(modelsTimeout+time.Second), true
	for {
		found, problems := d.scan(ctx, slices, pools, pods)
		if first && time.Now().Before(firstBy) && d.probe.untried(d.asking) {
			select {
			case <-ctx.Done():
				return
			case <-d.trigger:
			case <-time.After(time.Until(firstBy)):
			}
			continue
		}
		first = false
		problems = append(problems, apply(found)...)
		d.report(ctx, problems)
		select {
		case <-ctx.Done():
			return
		case <-d.trigger:
		}
		// coalesce a burst (a rollout changes many objects at once)
		select {
		case <-ctx.Done():
			return
		case <-time.After(d.opt.Debounce):
		}
		select {
		case <-d.trigger:
		default:
		}
	}
}

func nsName(ns string) string {
	if ns == "" {
		return "(all)"
	}
	return ns
}

// scan turns the informers' caches into engines, in a stable order.
func (d *Discoverer) scan(ctx context.Context, slices, pools []cache.Indexer, pods cache.Indexer) ([]fleet.Discovered, []error) {
	var found []fleet.Discovered
	var problems []error
	d.asking = map[string]bool{}
	defer func() { d.probe.want(ctx, d.asking) }()
	refs := map[string]corev1.ObjectReference{}
	for i, idx := range slices {
		src := d.opt.Config.Services[i]
		objs := idx.List()
		sort.Slice(objs, func(a, b int) bool { return key(objs[a]) < key(objs[b]) })
		for _, o := range objs {
			s, ok := o.(*discoveryv1.EndpointSlice)
			if !ok {
				continue
			}
			obj := "EndpointSlice " + s.Namespace + "/" + s.Name
			refs[obj] = corev1.ObjectReference{Kind: "EndpointSlice", APIVersion: "discovery.k8s.io/v1", Namespace: s.Namespace, Name: s.Name, UID: s.UID}
			f, p := d.fromSlice(obj, s, src, i)
			found, problems = append(found, f...), append(problems, p...)
		}
	}
	for i, idx := range pools {
		src := d.opt.Config.InferencePools[i]
		objs := idx.List()
		sort.Slice(objs, func(a, b int) bool { return key(objs[a]) < key(objs[b]) })
		for _, o := range objs {
			u, ok := o.(*unstructured.Unstructured)
			if !ok {
				continue
			}
			obj := "InferencePool " + u.GetNamespace() + "/" + u.GetName()
			refs[obj] = corev1.ObjectReference{Kind: "InferencePool", APIVersion: PoolResource.GroupVersion().String(), Namespace: u.GetNamespace(), Name: u.GetName(), UID: u.GetUID()}
			var pool inferencev1.InferencePool
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &pool); err != nil {
				problems = append(problems, &fleet.FieldError{File: obj, Path: "spec", Reason: fmt.Sprintf("not an inference.networking.k8s.io/v1 InferencePool: %v", err)})
				continue
			}
			f, p := d.fromPool(obj, &pool, pods, src, i)
			found, problems = append(found, f...), append(problems, p...)
		}
	}
	d.mu.Lock()
	d.refs = refs
	d.mu.Unlock()
	return found, problems
}

func key(o any) string {
	k, _ := cache.MetaNamespaceKeyFunc(o)
	return k
}

func (d *Discoverer) fromSlice(obj string, s *discoveryv1.EndpointSlice, src fleet.ServiceSource, srcIdx int) ([]fleet.Discovered, []error) {
	bad := func(path, format string, args ...any) []error {
		return []error{&fleet.FieldError{File: obj, Path: path, Reason: fmt.Sprintf(format, args...)}}
	}
	if len(s.Endpoints) == 0 {
		return nil, nil
	}
	if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 {
		return nil, bad("addressType", "%q is not IPv4 or IPv6: engines need a literal IP", s.AddressType)
	}
	port, portPath := int32(-1), ""
	for j, p := range s.Ports {
		if p.Port != nil && (src.Port == "" && len(s.Ports) == 1 || p.Name != nil && *p.Name == src.Port) {
			port, portPath = *p.Port, fmt.Sprintf("ports[%d].port", j)
		}
	}
	if port < 0 {
		if src.Port == "" {
			return nil, bad("ports", "has %d ports: set discovery.kubernetes.services[%d].port to the engines' port name", len(s.Ports), srcIdx)
		}
		return nil, bad("ports", "no port named %q (discovery.kubernetes.services[%d].port)", src.Port, srcIdx)
	}
	service := s.Labels[labelServiceName]
	if service == "" {
		service = s.Name
	}
	models, modelsPath := src.Models, fmt.Sprintf("(discovery.kubernetes.services[%d].models)", srcIdx)
	if v, ok := s.Annotations[AnnotationModels]; ok {
		models, modelsPath = splitModels(v), "metadata.annotations["+AnnotationModels+"]"
	}
	capacity, capPath, capErr := d.capacity(src.EngineDefaults, models, fmt.Sprintf("discovery.kubernetes.services[%d]", srcIdx),
		source{"metadata.labels", s.Labels}, source{"metadata.annotations", s.Annotations})
	if capErr != nil {
		return nil, bad(capPath, "%v", capErr)
	}
	var found []fleet.Discovered
	var problems []error
	for j, ep := range s.Endpoints {
		if len(ep.Addresses) == 0 {
			continue
		}
		name := hostPort(ep.Addresses[0], port)
		namePath := fmt.Sprintf("endpoints[%d].addresses[0]", j)
		if ep.TargetRef != nil && ep.TargetRef.Name != "" {
			name, namePath = ep.TargetRef.Name, fmt.Sprintf("endpoints[%d].targetRef.name", j)
		}
		region, regionPath := src.Region, fmt.Sprintf("(discovery.kubernetes.services[%d].region)", srcIdx)
		if r := s.Labels[LabelRegion]; r != "" {
			region, regionPath = r, "metadata.labels["+LabelRegion+"]"
		}
		if ep.Zone != nil && *ep.Zone != "" {
			if r, ok := d.opt.Config.ZoneRegions[*ep.Zone]; ok {
				region, regionPath = r, fmt.Sprintf("endpoints[%d].zone", j)
			} else if region == "" {
				regionPath = fmt.Sprintf("endpoints[%d].zone (zone %q is not in discovery.kubernetes.zone_regions)", j, *ep.Zone)
			}
		}
		ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
		terminating := ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
		addr := hostPort(ep.Addresses[0], port)
		epModels, epModelsPath, epCapacity, epCapPath := models, modelsPath, capacity, capPath
		served := len(models) == 0
		if served {
			var problem error
			if epModels, epModelsPath, problem = d.engineModels(addr, ready && !terminating); epModels == nil {
				if problem != nil {
					problems = append(problems, &fleet.FieldError{File: obj, Path: fmt.Sprintf("endpoints[%d]", j), Reason: problem.Error()})
				}
				continue
			}
			epCapacity, epCapPath, _ = d.capacity(src.EngineDefaults, epModels, fmt.Sprintf("discovery.kubernetes.services[%d]", srcIdx),
				source{"metadata.labels", s.Labels}, source{"metadata.annotations", s.Annotations})
		}
		e := d.engine(obj, s.Namespace+"/"+service+"/"+name, namePath,
			addr, fmt.Sprintf("endpoints[%d].addresses[0] (port %s)", j, portPath),
			region, regionPath, epModels, epModelsPath, epCapacity, epCapPath, src.EngineDefaults, !ready || terminating)
		e.ServedModels = served
		found = append(found, e)
	}
	return found, problems
}

// engineModels is what an engine whose objects name no models serves, from its
// /v1/models: nil while it has not answered yet, with a problem to report once asking
// failed repeatedly (only for a ready engine: one still starting is not a fault).
func (d *Discoverer) engineModels(addr string, ready bool) (models []string, path string, problem error) {
	d.asking[addr] = d.asking[addr] || ready
	st := d.probe.state(addr)
	if st.models != nil {
		return st.models, "GET http://" + addr + "/v1/models", nil
	}
	if ready {
		return nil, "", st.err
	}
	return nil, "", nil
}

func (d *Discoverer) fromPool(obj string, pool *inferencev1.InferencePool, pods cache.Indexer, src fleet.PoolSource, srcIdx int) ([]fleet.Discovered, []error) {
	bad := func(path, format string, args ...any) []error {
		return []error{&fleet.FieldError{File: obj, Path: path, Reason: fmt.Sprintf(format, args...)}}
	}
	if len(pool.Spec.Selector.MatchLabels) == 0 {
		return nil, bad("spec.selector.matchLabels", "is empty: it would select every pod of the namespace")
	}
	if len(pool.Spec.TargetPorts) == 0 {
		return nil, bad("spec.targetPorts", "is empty")
	}
	set := labels.Set{}
	for k, v := range pool.Spec.Selector.MatchLabels {
		set[string(k)] = string(v)
	}
	sel := labels.SelectorFromSet(set)
	members, _ := pods.ByIndex(cache.NamespaceIndex, pool.Namespace)
	sort.Slice(members, func(a, b int) bool { return key(members[a]) < key(members[b]) })
	var found []fleet.Discovered
	var problems []error
	poolDefaults := fmt.Sprintf("discovery.kubernetes.inference_pools[%d]", srcIdx)
	for _, o := range members {
		pod, ok := o.(*corev1.Pod)
		if !ok || !sel.Matches(labels.Set(pod.Labels)) || pod.Status.PodIP == "" ||
			pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		podObj := "Pod " + pod.Namespace + "/" + pod.Name
		models, modelsPath := src.Models, "("+poolDefaults+".models)"
		if v, ok := pool.Annotations[AnnotationModels]; ok {
			models, modelsPath = splitModels(v), obj+": metadata.annotations["+AnnotationModels+"]"
		}
		if v, ok := pod.Annotations[AnnotationModels]; ok {
			models, modelsPath = splitModels(v), podObj+": metadata.annotations["+AnnotationModels+"]"
		}
		capacity, capPath, capErr := d.capacity(src.EngineDefaults, models, poolDefaults,
			source{obj + ": metadata.annotations", pool.Annotations}, source{podObj + ": metadata.annotations", pod.Annotations})
		if capErr != nil {
			problems = append(problems, bad(capPath, "%v", capErr)...)
			continue
		}
		region, regionPath := src.Region, "("+poolDefaults+".region)"
		if r := pool.Labels[LabelRegion]; r != "" {
			region, regionPath = r, "metadata.labels["+LabelRegion+"]"
		}
		if z := pod.Labels[LabelZone]; z != "" {
			if r, ok := d.opt.Config.ZoneRegions[z]; ok {
				region, regionPath = r, podObj+": metadata.labels["+LabelZone+"]"
			}
		}
		if r := pod.Labels[LabelRegion]; r != "" {
			region, regionPath = r, podObj+": metadata.labels["+LabelRegion+"]"
		}
		ready := pod.DeletionTimestamp == nil
		cond := false
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodReady {
				cond = c.Status == corev1.ConditionTrue
			}
		}
		ready = ready && cond
		for k, tp := range pool.Spec.TargetPorts {
			name := pool.Namespace + "/" + pool.Name + "/" + pod.Name
			if len(pool.Spec.TargetPorts) > 1 {
				name += ":" + strconv.Itoa(int(tp.Number))
			}
			addr := hostPort(pod.Status.PodIP, int32(tp.Number))
			epModels, epModelsPath, epCapacity, epCapPath := models, modelsPath, capacity, capPath
			served := len(models) == 0
			if served {
				var problem error
				if epModels, epModelsPath, problem = d.engineModels(addr, ready); epModels == nil {
					if problem != nil {
						problems = append(problems, &fleet.FieldError{File: obj, Path: fmt.Sprintf("%s (port spec.targetPorts[%d])", podObj, k), Reason: problem.Error()})
					}
					continue
				}
				epCapacity, epCapPath, _ = d.capacity(src.EngineDefaults, epModels, poolDefaults,
					source{obj + ": metadata.annotations", pool.Annotations}, source{podObj + ": metadata.annotations", pod.Annotations})
			}
			e := d.engine(obj, name, podObj+": metadata.name",
				addr, fmt.Sprintf("%s: status.podIP (port spec.targetPorts[%d])", podObj, k),
				region, regionPath, epModels, epModelsPath, epCapacity, epCapPath, src.EngineDefaults, !ready)
			e.ServedModels = served
			found = append(found, e)
		}
	}
	return found, problems
}

func (d *Discoverer) engine(obj, name, namePath, addr, addrPath, region, regionPath string, models []string, modelsPath string,
	capacity float64, capPath string, def fleet.EngineDefaults, draining bool) fleet.Discovered {
	metrics := def.MetricsPath
	if metrics == "" {
		metrics = "/metrics"
	}
	return fleet.Discovered{
		Engine: fleet.Engine{Name: name, Address: addr, Region: region, Models: models, CapacityRPS: capacity,
			MaxInFlight: def.MaxInFlight, MetricsURL: "http://" + addr + metrics, Draining: draining},
		Object: obj,
		Fields: map[string]string{"name": namePath, "address": addrPath, "region": regionPath, "models": modelsPath,
			"capacity_rps": capPath, "metrics_url": addrPath},
	}
}

type source struct {
	path string
	kv   map[string]string
}

// capacity resolves an engine's capacity: the last of the sources that sets
// meridian.dev/capacity-rps, else the discovery source's capacity_rps, else the smallest
// capacity_rps of its models (0 when none: validation then names the field to set).
func (d *Discoverer) capacity(def fleet.EngineDefaults, models []string, defPath string, srcs ...source) (float64, string, error) {
	for i := len(srcs) - 1; i >= 0; i-- {
		if v, ok := srcs[i].kv[AnnotationCapacity]; ok {
			path := srcs[i].path + "[" + AnnotationCapacity + "]"
			c, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil || !(c > 0) || math.IsInf(c, 0) {
				return 0, path, fmt.Errorf("%q is not a finite number > 0 (requests/s)", v)
			}
			return c, path, nil
		}
	}
	if def.CapacityRPS > 0 {
		return def.CapacityRPS, defPath + ".capacity_rps", nil
	}
	best := 0.0
	for _, m := range d.opt.Models {
		for _, name := range models {
			if m.Name == name && m.CapacityRPS > 0 && (best == 0 || m.CapacityRPS < best) {
				best = m.CapacityRPS
			}
		}
	}
	return best, "(no " + AnnotationCapacity + " annotation, " + defPath + ".capacity_rps or models[].capacity_rps)", nil
}

func splitModels(v string) []string {
	var out []string
	for _, m := range strings.Split(v, ",") {
		if m = strings.TrimSpace(m); m != "" {
			out = append(out, m)
		}
	}
	return out
}

func hostPort(ip string, port int32) string {
	if strings.Contains(ip, ":") {
		return "[" + ip + "]:" + strconv.Itoa(int(port))
	}
	return ip + ":" + strconv.Itoa(int(port))
}

// report logs, counts and records as Events the objects left out; an object is reported
// again only when its problems change.
func (d *Discoverer) report(ctx context.Context, problems []error) {
	byObj := map[string][]string{}
	for _, p := range problems {
		var fe *fleet.FieldError
		if errors.As(p, &fe) && fe.File != "" {
			byObj[fe.File] = append(byObj[fe.File], fe.Path+": "+fe.Reason)
		} else {
			byObj["(fleet)"] = append(byObj["(fleet)"], p.Error())
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for obj := range d.reported {
		if _, still := byObj[obj]; !still {
			delete(d.reported, obj)
			d.opt.Log.Info("discovered object accepted again", "object", obj)
		}
	}
	d.opt.Metrics.rejected.Set(float64(len(byObj)))
	for obj, msgs := range byObj {
		sort.Strings(msgs)
		msg := strings.Join(msgs, "; ")
		if d.reported[obj] == msg {
			continue
		}
		d.reported[obj] = msg
		d.opt.Metrics.rejections.Inc()
		d.opt.Log.Warn("discovered object left out of the fleet", "object", obj, "problems", msg)
		if ref, ok := d.refs[obj]; ok {
			go d.event(ctx, ref, msg)
		}
	}
}

// event records a Warning Event on the object a problem is about.
func (d *Discoverer) event(ctx context.Context, ref corev1.ObjectReference, msg string) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if len(msg) > 1000 {
		msg = msg[:1000] + "..."
	}
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta:          metav1.ObjectMeta{GenerateName: ref.Name + ".", Namespace: ref.Namespace},
		InvolvedObject:      ref,
		Reason:              "EngineRejected",
		Message:             "left out of the meridian fleet: " + msg,
		Type:                corev1.EventTypeWarning,
		Source:              corev1.EventSource{Component: d.opt.Component},
		FirstTimestamp:      now,
		LastTimestamp:       now,
		Count:               1,
		ReportingController: "meridian.dev/control",
		ReportingInstance:   d.opt.Component,
	}
	if _, err := d.client.CoreV1().Events(ref.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		d.watchError("events", err)
		d.opt.Log.Warn("could not record an Event for a left-out object", "object", ref.Kind+" "+ref.Namespace+"/"+ref.Name, "err", err)
	}
}
