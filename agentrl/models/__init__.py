"""agentrl.models"""
