/* placeholder: the cluster forwarder is being written */
int main(void){return 1;}
