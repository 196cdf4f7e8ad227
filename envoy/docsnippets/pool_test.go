package docsnippets

import (
	"bytes"
	"errors"
	"fmt"

	"gopkg.in/yaml.v3"
)

// inferencePool is the part of the Gateway API Inference Extension's v1 InferencePool
// (inference.networking.k8s.io/v1) that the docs use; decoding rejects any other field.
type inferencePool struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name      string `yaml:"name"`
		Namespace string `yaml:"namespace"`
	} `yaml:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		TargetPorts       []port `yaml:"targetPorts"`
		AppProtocol       string `yaml:"appProtocol"`
		EndpointPickerRef struct {
			Group       string `yaml:"group"`
			Kind        string `yaml:"kind"`
			Name        string `yaml:"name"`
			Port        *port  `yaml:"port"`
			FailureMode string `yaml:"failureMode"`
		} `yaml:"endpointPickerRef"`
	} `yaml:"spec"`
}

type port struct {
	Number int `yaml:"number"`
}

// checkInferencePool applies the v1 API's required fields and enums.
func checkInferencePool(body []byte) error {
	dec := yaml.NewDecoder(bytes.NewReader(body))
	dec.KnownFields(true)
	var p inferencePool
	if err := dec.Decode(&p); err != nil {
		return fmt.Errorf("not a v1 InferencePool: %w", err)
	}
	var errs []error
	if p.APIVersion != "inference.networking.k8s.io/v1" || p.Kind != "InferencePool" {
		errs = append(errs, fmt.Errorf("apiVersion %q kind %q", p.APIVersion, p.Kind))
	}
	if p.Metadata.Name == "" || len(p.Spec.Selector.MatchLabels) == 0 {
		errs = append(errs, errors.New("metadata.name and spec.selector.matchLabels are required"))
	}
	if n := len(p.Spec.TargetPorts); n < 1 || n > 8 {
		errs = append(errs, fmt.Errorf("spec.targetPorts has %d ports, want 1..8", n))
	}
	ref := p.Spec.EndpointPickerRef
	ports := append([]port{}, p.Spec.TargetPorts...)
	if ref.Port != nil {
		ports = append(ports, *ref.Port)
	}
	for _, pt := range ports {
		if pt.Number < 1 || pt.Number > 65535 {
			errs = append(errs, fmt.Errorf("port %d out of range", pt.Number))
		}
	}
	if ref.Name == "" {
		errs = append(errs, errors.New("spec.endpointPickerRef.name is required"))
	}
	switch ref.FailureMode {
	case "", "FailOpen", "FailClose":
	default:
		errs = append(errs, fmt.Errorf("spec.endpointPickerRef.failureMode %q: want FailOpen or FailClose", ref.FailureMode))
	}
	switch p.Spec.AppProtocol {
	case "", "http", "kubernetes.io/h2c":
	default:
		errs = append(errs, fmt.Errorf("spec.appProtocol %q", p.Spec.AppProtocol))
	}
	return errors.Join(errs...)
}
