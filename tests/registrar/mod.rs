//! `registrar`, the drop-in node-driver-registrar, between a real CSI driver socket and a
//! kubelet-side client on its real registration socket.

mod registration;
